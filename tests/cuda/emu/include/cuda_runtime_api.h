// The CUDA runtime API on the CPU (tests/cuda/emu): see emu_runtime.h.
#pragma once
#include "emu_runtime.h"
