"""Python sources the definition-index tests and the hover-card tests share."""

CALLS = '''def helper(x):
    return x


def scale(v, k):
    return v * k


def zoom(a):
    return a


def combine(a, b):
    if not a:
        return combine(b, a)
    return zoom(a) + missing(b) + scale(b, 2)
'''
"""`combine` uses `zoom` and `scale` (in that order), itself and `missing` (defined nowhere)."""
