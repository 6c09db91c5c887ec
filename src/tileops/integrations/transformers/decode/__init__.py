"""Decode capture: decode steps replayed from a captured graph of op launches
(``replay.py``), a plain causal LM's step served whole (``causal_lm.py``), and greedy
``generate`` with its steps in C++ (``generate.py``)."""
