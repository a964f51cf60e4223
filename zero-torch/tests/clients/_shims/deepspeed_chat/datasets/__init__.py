"""Stand-in for Hugging Face ``datasets`` (not installed in the test environment), for
DeepSpeed-Chat's ``local/jsonfile`` dataset (``dschat/utils/data/raw_datasets.py``):
``load_dataset("json", data_files={split: path})`` reads each file (JSON Lines, or one JSON
array) into a list of records per split; ``load_from_disk`` is never reached there (it is
imported). What DeepSpeed-Chat does with a split (``len``, indexing, iteration through a
``torch.utils.data.Subset``) is what a list does. Only appended to ``sys.path`` by the
client suite's bootstrap, so an installed ``datasets`` wins."""

import json


class Dataset(list):
    """One split: its records, in file order."""


def _read(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return Dataset(json.loads(text))
    return Dataset(json.loads(line) for line in text.splitlines() if line.strip())


def load_dataset(path, data_files=None, **kwargs):
    """``load_dataset("json", data_files=...)``: ``{split: Dataset}`` (a single path or
    list is the split ``train``, as in ``datasets``)."""
    if path != "json":
        raise NotImplementedError(f"the datasets stand-in reads local JSON files only, not {path!r}")
    if isinstance(data_files, (str, list)):
        data_files = {"train": data_files}
    out = {}
    for split, files in dict(data_files or {}).items():
        records = Dataset()
        for file in [files] if isinstance(files, str) else files:
            records.extend(_read(file))
        out[split] = records
    return out


def load_from_disk(path, **kwargs):
    raise NotImplementedError("the datasets stand-in has no load_from_disk (DeepSpeed-Chat's local/jsonfile never calls it)")
