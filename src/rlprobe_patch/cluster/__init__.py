"""Every node of a Ray cluster as one transaction: `operations.py` drives the nodes, `node.py`
is what runs on each (shipped by value; the standard library only)."""
