// The CUDA runtime and device language on the CPU (tests/cuda/emu): see emu_runtime.h, emu_device.h.
#pragma once
#include "emu_device.h"
#include "emu_runtime.h"
