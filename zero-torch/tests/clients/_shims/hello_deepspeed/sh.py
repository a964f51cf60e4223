"""Stand-in for the ``sh`` package (not installed in the test environment), for the two
calls of ``train_bert_ds.py``'s ``create_experiment_dir``: ``sh.git.log(...)`` and
``sh.git.diff(...)``. They raise what ``sh`` raises where git runs outside a repository
(``ErrorReturnCode_128`` for ``log``, ``ErrorReturnCode_129`` for ``diff``), which the
script catches and logs; the suite runs in a temporary folder, and this stand-in never
runs git, so the result does not depend on where that folder is. Only appended to
``sys.path`` by the client suite's bootstrap, so an installed ``sh`` wins."""


class ErrorReturnCode(Exception):
    exit_code = 1


class ErrorReturnCode_128(ErrorReturnCode):
    exit_code = 128


class ErrorReturnCode_129(ErrorReturnCode):
    exit_code = 129


class _Git:
    def log(self, *args, **kwargs):
        raise ErrorReturnCode_128("git log: fatal: not a git repository (sh stand-in)")

    def diff(self, *args, **kwargs):
        raise ErrorReturnCode_129("git diff: usage outside a repository (sh stand-in)")


git = _Git()
