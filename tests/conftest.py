"""Settings for every test: one torch thread.

The networks here are small: a second thread only adds synchronisation, and on a shared 2-core machine
two threads per process slowed some tests more than tenfold. The notebooks make the same choice.
"""

import torch

torch.set_num_threads(1)
