#include "kernels/kernels.h"
namespace maskd::kernels { bool BuiltWithCuda() { return false; } }
