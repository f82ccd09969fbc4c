// cub/device/device_radix_sort.cuh for the CPU emulation: tests/cuda/emu/include/cub/emu_cub.h.
#pragma once
#include "cub/emu_cub.h"
