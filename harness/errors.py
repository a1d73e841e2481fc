"""The one exception type a user ever sees as a message instead of a traceback, and what counts as
running out of memory (one table, for every library a trial calls into).

Imports no torch: torch's own OutOfMemoryError is checked by name, so the parent can use the table too.
"""
from __future__ import annotations

import difflib


class UserError(Exception):
    """Bad input from the user: the CLI prints it as one line and exits 2.

    The message says what is wrong, where, and what to do next.
    """


def did_you_mean(word: str, options) -> str:
    """" (did you mean 'width'?)" for the option closest to a mistyped `word`, else ""."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def as_written(value) -> str:
    """A value in a message as the YAML file spells it: true and null, not Python's True and None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


# What a library says when it could not get memory, matched case-insensitively in an exception's
# message and in the messages of the exceptions it was raised from. Each is quoted from the source
# that raises it (pytorch aten/src/ATen/cuda/Exceptions.h, c10/cuda, ProcessGroupNCCL, glibc).
OOM_MESSAGES = (
    "out of memory",            # CUDA caching allocator, cudaErrorMemoryAllocation, NCCL's "Cuda failure 2 'out of memory'"
    "can't allocate memory",    # torch's CPU allocator under RLIMIT_DATA (ENOMEM)
    "cannot allocate memory",
    "std::bad_alloc",
    "_alloc_failed",            # CUBLAS_STATUS_ALLOC_FAILED ("CUDA error: ... when calling `cublasCreate(handle)`"),
                                # CUDNN_STATUS_ALLOC_FAILED, CUSPARSE_/CUSOLVER_STATUS_ALLOC_FAILED, CUFFT_ALLOC_FAILED
    "failed to cuda calloc",    # NCCL's last error when its buffers do not fit ("Failed to CUDA calloc async 4 bytes")
    "failed to cuda malloc",
)
# What a library says when it gave up for want of memory without saying so: an OOM only where the
# process has already been refused memory (at the wall). oneDNN (CPU convolutions) when its allocation
# fails; cuDNN when no engine's workspace could be allocated (it tries each plan and gives up).
AT_WALL_MESSAGES = (
    "could not create a primitive",
    "could not execute a primitive",  # oneDNN's scratchpad refused in backward (AVX2-only hosts)
    "cudnn_status_not_supported",
    "unable to find an engine to execute this computation",
)
OOM_TYPES = ("OutOfMemoryError", "MemoryError")  # torch.OutOfMemoryError (== torch.cuda.OutOfMemoryError), Python's


def is_oom(exc: BaseException | None, at_wall: bool = False) -> bool:
    """Whether `exc`, or any exception it was raised from, is an allocation failure. `at_wall`: the
    process was refused memory before (a CPU memory wall is set, or the CUDA allocator counted an OOM),
    so a library's vaguer failure counts too."""
    while exc is not None:
        if any(t.__name__ in OOM_TYPES for t in type(exc).__mro__):
            return True
        if is_oom_text(str(exc), at_wall):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def is_oom_text(text: str, at_wall: bool = False) -> bool:
    text = text.lower()
    return any(m in text for m in OOM_MESSAGES) or (at_wall and any(m in text for m in AT_WALL_MESSAGES))
