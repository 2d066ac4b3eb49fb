// ODR test: second CUDA TU; with c.cu it catches kernels defined non-static in headers.
#include "odr_probe.hpp"

int odr_d() { return odr_probe(); }
