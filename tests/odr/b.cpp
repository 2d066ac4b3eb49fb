// ODR test: second host TU. See odr_probe.hpp.
#include "odr_probe.hpp"

int odr_b() { return odr_probe(); }
