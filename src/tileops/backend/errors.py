"""What goes wrong, by kind. Every message is written by the engine in one place."""


class BackendError(Exception):
    """Base of every protocol error: a backend, a target or the registry misbehaved."""


class UnknownTargetError(BackendError, LookupError):
    """A target was named that no installed backend registered."""


class AmbiguousTargetError(BackendError):
    """Two or more targets claim the device of a call; ``target=`` must choose."""


class OpNotAvailableError(BackendError):
    """The chosen target (or the in-tree set) has no kernel for this op."""
