// ODR test: first CUDA TU (only when the CUDA language is enabled). See odr_probe.hpp.
#include "odr_probe.hpp"

int odr_c() { return odr_probe(); }
