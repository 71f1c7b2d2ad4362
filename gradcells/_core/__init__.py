"""What the public face and every backend share: the result, weight and settings types, the
backend protocol, the argument specifications, array-library detection and the sequence
plumbing. It imports only NumPy and the standard library.
"""
