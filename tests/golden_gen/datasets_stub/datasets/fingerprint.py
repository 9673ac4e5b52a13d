"""Stand-in for datasets.fingerprint (see __init__.py): Hasher serves precompute_ref_log_probs only."""


class Hasher:
    @staticmethod
    def hash(_value):
        raise NotImplementedError("datasets stub: Hasher (precompute_ref_log_probs) is not provided")
