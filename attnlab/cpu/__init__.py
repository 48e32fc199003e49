"""attnlab.cpu: the CPU decoding engine, applied to a built model from beside it.

The teaching blocks in :mod:`attnlab.nn` compute each equation plainly. Decoding on a CPU reads
every weight once per token, so speed there is a matter of bytes and kernels: this package holds
attnlab's own C++ kernels, their loader, the layers that call them and the preparation that
swaps them into a finished model (:func:`for_decoding`), as gpt-fast applies quantisation and
torchtitan applies parallelism. Nothing in ``nn/`` imports it.
"""
