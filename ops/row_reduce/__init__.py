"""Row reductions (sum, mean, max over the last mode): the reduction anchors of the fusion
backend: the kernels (``kernels``), and their anchor record and planner (``fusion``), which
registers with ``hexlayout.fusion.anchors`` when imported."""
