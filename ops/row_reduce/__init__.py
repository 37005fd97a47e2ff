"""Row reductions (sum, mean, max over the last mode): the reduction anchors of the fusion
backend (``kernels``), registered with ``hexlayout.fusion`` when imported."""
