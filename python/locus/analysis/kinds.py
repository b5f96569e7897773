"""Lock event kinds and flags of runtime/include/locus_format.h, and how they group."""

import numpy as np

MUTEX = 1
RWLOCK_RD = 2
RWLOCK_WR = 3
SPIN = 4
COND_WAIT = 5
BARRIER = 6
SEM_WAIT = 7
OMP_LOCK = 8
OMP_NEST_LOCK = 9
OMP_CRITICAL = 10
OMP_BARRIER = 11
COND_SIGNAL = 12
SEM_POST = 13
JOIN = 14
CREATE = 15
KIND_MAX = 16

EV_CONTENDED = 1
EV_TRY = 2
EV_FAILED = 4
EV_UNRELEASED = 8
EV_SAMPLED = 16
EV_BROADCAST = 32

# Critical sections: wait = t_acq - t_req, hold = t_rel - t_acq.
HOLD_KINDS = frozenset({MUTEX, RWLOCK_RD, RWLOCK_WR, SPIN, OMP_LOCK, OMP_NEST_LOCK, OMP_CRITICAL})
# Pure waits: wait = t_acq - t_req, no hold.
WAIT_KINDS = frozenset({COND_WAIT, BARRIER, SEM_WAIT, OMP_BARRIER, JOIN})
BARRIER_KINDS = frozenset({BARRIER, OMP_BARRIER})
# Instants: only the critical path uses them.
INSTANT_KINDS = frozenset({COND_SIGNAL, SEM_POST, CREATE})

# A lock's identity is (process, address, family): the read and write sides of a rwlock
# are one lock, a cond's waits and signals are one object.
FAMILY_NAMES = [
    "none",
    "mutex",
    "rwlock",
    "spin",
    "cond",
    "barrier",
    "sem",
    "omp_lock",
    "omp_nest_lock",
    "omp_critical",
    "omp_barrier",
    "join",
    "create",
]
_FAMILY = np.array([0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10, 4, 6, 11, 12], dtype=np.uint8)


def family_of(kind: np.ndarray) -> np.ndarray:
    """Family code (index into FAMILY_NAMES) of each kind."""
    k = np.asarray(kind).astype(np.int64)
    return _FAMILY[np.clip(k, 0, KIND_MAX - 1)]
