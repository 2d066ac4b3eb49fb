// The consumer program compiled by nvcc (see main.cpp), with one trivial kernel so the CUDA
// language path really produces device code.
#include "main.cpp"

__global__ void trainkit_consumer_kernel(float* x) { x[threadIdx.x] *= 2.0f; }
