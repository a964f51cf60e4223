"""Stand-in for pytz (not installed in the test environment): ``pytz.timezone(name)`` as
``zoneinfo.ZoneInfo(name)``, which ``datetime.datetime.now(tz)`` accepts as pytz's zones.
``train_bert_ds.py`` uses it only to name its experiment folder. Only appended to
``sys.path`` by the client suite's bootstrap, so an installed pytz wins."""

import datetime
import zoneinfo

utc = UTC = datetime.timezone.utc


class UnknownTimeZoneError(KeyError):
    pass


def timezone(zone):
    try:
        return zoneinfo.ZoneInfo(zone)
    except zoneinfo.ZoneInfoNotFoundError as e:
        raise UnknownTimeZoneError(zone) from e
