"""What ``enable`` serves and how it is applied: the plan of each module (``plan.py``,
``attention.py``, ``rope.py``, ``moe.py``), the typed state each served module keeps
(``state.py``), the report (``report.py``), and enable/disable (``enable.py``)."""
