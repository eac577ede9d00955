"""The master's errors. Messages are the original's, word for word: clients match on them."""

from __future__ import annotations

#: How a failure report that a dataset file changed after indexing begins (formats/changed.py):
#: the master stops the job instead of charging the task.
FILE_CHANGED = "dataset file changed after the master indexed it"


class MasterError(Exception):
    """Base of every error the master reports to a trainer."""

    message = "master error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.message)


class PassBeforeError(MasterError):
    """The trainer asked for a pass the master has already finished."""

    message = "pass number smaller than master"


class PassOverError(PassBeforeError):
    """Raised by the client, not the master: a trainer asked for the records of a pass that was
    over before it took part in it (the text names the master's current pass)."""

    message = "that pass is over"


class PassAfterError(MasterError):
    """The trainer asked for a pass the master has not started yet."""

    message = "pass number larger than master"


class NoMoreAvailableError(MasterError):
    """No task to hand out before the caller's deadline, though the pass is not over."""

    message = "no more available task"


class AllTaskFailedError(MasterError):
    """Nothing to do in this pass: every task failed (the original's text says "finished")."""

    message = "all task finished"


class DatasetError(MasterError):
    """The dataset given to set_dataset is unusable (the text says why)."""

    message = "no valid dataset specified"


class NoDatasetError(DatasetError):
    message = "no dataset specified"


class DatasetMismatchError(MasterError):
    """A trainer named another dataset than the one the master serves (another job's data
    left in the store, or a typo): it is refused, not served the master's dataset. The text
    names both."""

    message = "the dataset differs from the master's"


class NotAMixtureError(MasterError):
    """Weights were given for a job whose dataset is one list of patterns, not a mixture of
    named sources (docs/mixtures.md)."""

    message = "the job's dataset is not a mixture: weights apply to a mixture of sources"


class TrainerIdEmptyError(MasterError):
    message = "trainer id is empty"


class NotReadyError(MasterError):
    """No dataset has been set yet and the caller's deadline passed while waiting for one."""

    message = "master has no dataset yet: call set_dataset first"


class UnavailableError(MasterError):
    """The master cannot make changes durable right now (store down, or not the leader)."""

    message = "master unavailable"


class InvalidArgumentError(MasterError):
    """A request value is out of range (the text names the argument); nothing changed."""

    message = "invalid argument"


class SessionExpiredError(MasterError):
    """The trainer's session ended (its lease ran out): its tasks went back to the queue."""

    message = "session expired: its tasks were handed back; open a new session"


class CheckpointRefusedError(MasterError):
    """A commit or data checkpoint the master cannot take (the text says why)."""

    message = "checkpoint refused"


class UnauthenticatedError(MasterError):
    """The call carried no token, or a wrong one: nothing was done."""

    message = "unauthenticated: this master needs the job's token (authorization: Bearer ...)"


class PermissionDeniedError(MasterError):
    """The caller may not do this (a dataset outside the master's data roots); nothing changed."""

    message = "permission denied"


class JobStoppedError(MasterError):
    """More records were quarantined in a pass than the error budget allows: the job stopped.
    The text names the tasks, their files and chunks, and why they failed."""

    message = "job stopped: the error budget for quarantined tasks was exceeded"


class RanksMissingError(MasterError):
    """Equal steps with a declared world size: some ranks never opened a session within the
    master's --rank-wait, so the pass cannot be shared among them. The text names them."""

    message = "ranks missing"


class WorldMismatchError(MasterError):
    """Equal steps with a declared world size: this trainer's WORLD_SIZE or RANK contradicts
    the job's live world (another world size, or a rank a live session holds). It gets none of
    the world's passes, and must not wait for them as a rank of it: the text names both
    declarations."""

    message = "world mismatch"
