// Training batches read one ahead on a worker thread: while a step computes (on the GPU), the next
// micro-batch is already being read from the shards (memory-mapped: a cold page cache costs
// milliseconds there), so next() hands over a batch that is in memory. The batches, their order and
// the saved state are the inner source's exactly: state() is the position after the batches next()
// gave (the batch read ahead is not counted), so a checkpoint resumes at the same batch; restore()
// drops the batch read ahead. A read that fails throws from the next() that asks for that batch.
#pragma once
#include "train/trainer.h"

namespace jtok {

// inner wrapped: the same batches, each read ahead while the caller works. Shapes: the read ahead
// is of the last next()'s (B, T); a next() of another shape reads again from the saved position.
BatchSource prefetching(BatchSource inner);

}  // namespace jtok
