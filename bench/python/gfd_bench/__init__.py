"""gfd's Python benchmarks, kept out of the installed package: run them from a checkout with
``bench/python`` on ``PYTHONPATH`` beside the gfd package (bench/measure.sh does so).

- ``python -m gfd_bench``: scattered blocks of one pool through the binding, each backend against
  a contiguous copy of the same bytes (``--layout paged``: :mod:`gfd_bench.paged`).
- ``python -m gfd_bench.paged``: every layer's K and V caches through ``copy_blocks``, as vLLM
  calls gfd.
- ``python -m gfd_bench.vllm``: gfd's vLLM offloading worker against vLLM's own copy path.
- ``python -m gfd_bench.sglang``: HiCache's loads and write-backs as gfd.sglang makes them.
"""
