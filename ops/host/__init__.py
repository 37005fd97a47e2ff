"""Host-side building blocks every op package shares: the device's architecture
(``device``), argument checks that name the op and the argument (``checks``), and building
and running a kernel on CUDA or in the emulator (``launch``)."""
