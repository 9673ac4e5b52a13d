"""A stand-in for the `datasets` package, which the GPU machine lacks (dpo_golden.py, peer_dpo.py).

TRL 1.16 imports `datasets` at module load (trl.data_utils, trl.trainer.base_trainer,
trl.trainer.dpo_trainer, trl.experimental.orpo). What the golden and the bench use of it is a
list of rows that TRL's trainers `map` and `filter` while preparing the data: `Dataset` holds
those rows (from_list, len, [i], [column], iteration, column_names, map over rows with
fn_kwargs / with_indices and remove_columns, filter). `DatasetDict`, `IterableDataset` and
`IterableDatasetDict` exist for TRL's isinstance checks only (nothing here builds one);
`concatenate_datasets` and `fingerprint.Hasher` serve `precompute_ref_log_probs`, which neither
script uses: they raise.  On sys.path the stub makes transformers' is_datasets_available() true
(it looks for the module, not its metadata), so transformers' Trainer treats a `Dataset` as a
datasets one when it builds the peer's DataLoader: it reads `__version__` (the datasets API
level TRL 1.16 asks for, >= 4.7.0) and calls `remove_columns` on the columns no forward takes.
dpo_trl.py puts the stub on the path before anything of Hugging Face is imported, so that is
so in every run.
"""

__version__ = "4.7.0"


class Dataset:
    def __init__(self, rows):
        self._rows = [dict(r) for r in rows]

    @classmethod
    def from_list(cls, rows):
        return cls(rows)

    # An in-memory dataset has no cache files (TRL's trainers read this at __init__, for the
    # telemetry that HF_HUB_DISABLE_TELEMETRY then turns off).
    cache_files = []

    def __len__(self):
        return len(self._rows)

    def __iter__(self):
        return (dict(r) for r in self._rows)

    def __getitem__(self, key):
        if isinstance(key, str):
            return [r[key] for r in self._rows]
        return dict(self._rows[key])

    @property
    def column_names(self):
        return list(self._rows[0]) if self._rows else []

    def map(self, function, fn_kwargs=None, with_indices=False, batched=False, remove_columns=None, **_):
        if batched:
            raise NotImplementedError("datasets stub: batched map is not provided")
        out = []
        for i, row in enumerate(self._rows):
            args = (dict(row), i) if with_indices else (dict(row),)
            new = function(*args, **(fn_kwargs or {}))
            merged = {k: v for k, v in row.items() if k not in (remove_columns or [])}
            merged.update(new)
            out.append(merged)
        return Dataset(out)

    def remove_columns(self, names):
        names = [names] if isinstance(names, str) else list(names)
        return Dataset([{k: v for k, v in r.items() if k not in names} for r in self._rows])

    def filter(self, function, fn_kwargs=None, **_):
        return Dataset([r for r in self._rows if function(dict(r), **(fn_kwargs or {}))])


class DatasetDict(dict):
    pass


class IterableDataset:
    pass


class IterableDatasetDict(dict):
    pass


def concatenate_datasets(*_args, **_kwargs):
    raise NotImplementedError("datasets stub: concatenate_datasets (precompute_ref_log_probs) is not provided")
