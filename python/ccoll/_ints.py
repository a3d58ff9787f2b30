"""Checks the integers the binding hands to C: ctypes would silently keep only the low bits of one too large for its
C type, and int() would silently truncate a fraction or take a bool for 0 or 1."""

import math
import numbers
import operator

import numpy as np

from .errors import InvalidArgumentError

INT_MIN, INT_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
# A ccConfig_t field: INT_MIN is CC_CONFIG_UNDEF_INT ("not set"), so the lowest value that can be set is one above.
CONFIG_MIN = INT_MIN + 1


def integer(value, what, lo=INT_MIN, hi=INT_MAX):
    """value as an int in [lo, hi] (default: a C int's range): an integer (int, numpy integer, anything with
    __index__) or an integral float. A bool, a fraction, a string or a value out of range is an InvalidArgumentError
    naming `what`."""
    if isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError("%s must be an integer, not the bool %r" % (what, value))
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not hasattr(value, "__index__"):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise InvalidArgumentError("%s must be an integer, not %r" % (what, value))
        number = int(value)
    else:
        try:
            number = operator.index(value)
        except TypeError:
            raise InvalidArgumentError("%s must be an integer, not %s %r" % (what, type(value).__name__, value)) \
                from None
    if not lo <= number <= hi:
        raise InvalidArgumentError("%s %d is out of range (%d .. %d)" % (what, number, lo, hi))
    return number


def int64(value, what):
    """integer(value, what) in an int64_t's range."""
    return integer(value, what, INT64_MIN, INT64_MAX)
