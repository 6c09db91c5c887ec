"""The fused paths: the served modules' forwards and their row forms (``forwards.py``),
projections stacked and decoder layers fused (``fusion.py``), the base model as one loop
(``model.py``), and the served weights on huge pages (``placement.py``)."""
