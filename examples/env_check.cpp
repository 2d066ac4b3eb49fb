#include <cstdio>
#include <trainkit/config.hpp>
int main() { std::printf("trainkit %s\n", trainkit::version().string); }
