// Model weights <-> safetensors with Hugging Face Qwen-style names (docs/model.md).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "model/transformer.h"

namespace jtok {

// Every parameter: the flat ones and the token-indexed (JTok, JTok-M) tables. A table is stored in
// its dtype: F32, BF16, I8 or (int4) U8 of shape (rows, (dim + 1) / 2), two values a byte
// (ops/int4_rows.h); I8 and U8 with their per-row scales beside them as F32 tensor <name>_scale (rows).
StFile weights_to_st(const Model& m);  // tables on disk (TokenTable::on_disk) left out
// The int8 / int4 scales' tensor name of table `table`: table + "_scale".
std::string table_scale_name(const std::string& table);
// Table `name` of f: its dtype (F32, BF16, I8 or U8 = int4; I8 and U8 tables need their F32 (rows)
// scales), after checking shape (rows, dim), (rows, (dim + 1) / 2) for U8; errors name the file and tensor.
Dtype table_dtype_in_file(const StIndex& f, const std::string& name, int64_t rows, int64_t dim);
// Copies every parameter (tables included) from f into m. Errors (naming `origin`) on a missing
// tensor, a wrong shape or dtype, or a tensor the model does not have.
void load_weights(Model& m, const StFile& f, const std::string& origin);
// The same, streamed from the file one tensor at a time into m's buffers (checkpoints: nothing of
// the file's size is held beside the model). bf16 / int8 / int4 tables (inference exports) load as
// read-only quantized RAM tables (the training loader refuses them: load_checkpoint).
// tables = false: the tables' tensors are checked (present, F32, shape) but not read (a rank of an
// embedding-parallel run reads only its rows: dist::ShardedTables). tables_in_file = false (with
// tables = false): the file has no tables at all (a run whose tables are in a training store on
// disk, store/train_table_store.h); a table tensor in it is then unexpected.
void load_weights(Model& m, const StIndex& f, bool tables = true, bool tables_in_file = true);
// The same from a mapped safetensors file, with the token tables left in it: the flat parameters
// are copied, every table becomes a read-only view of its rows in the file (TokenTable::view, read
// in place; resident memory is the pages touched). Same checks and errors as load_weights, plus a
// table's data offset must be aligned to its elements (files we write are). Tables of any dtype. Build m with
// ModelAlloc{.tables = false}: its tables then never had storage of their own.
void load_weights_mapped(Model& m, const std::shared_ptr<const MappedFile>& file);

// Gradients under prefix + name; the tables' row-sparse gradients written dense (tests only).
StFile grads_to_st(const Model& m, const std::string& prefix);
// A buffer in the flat parameter layout (e.g. AdamW moments) under prefix + name.
StFile flat_to_st(const Model& m, std::span<const float> buffer, const std::string& prefix);
// A buffer holding some of the flat parameters: parameter i at buffer[offsets[i]], or absent (offsets[i]
// < 0; the AdamW moments of a run with frozen tensors: AdamWState::moment_offset).
StFile flat_to_st(const Model& m, std::span<const float> buffer, const std::string& prefix,
                  const std::vector<int64_t>& offsets);
// Buffers shaped like m.tables (e.g. the tables' AdamW moments), one per table, under prefix + table name.
StFile tables_to_st(const Model& m, const std::vector<std::vector<float>>& per_table, const std::string& prefix);

// Copies tensor `name` of f into dst (numel floats, expected shape); errors name origin.
void copy_tensor(const StFile& f, const std::string& name, const std::vector<int64_t>& shape, float* dst,
                 const std::string& origin);
// Reads tensor `name` of the file behind f (F32, the expected shape) into dst; errors name the file.
void read_tensor_f32(const StIndex& f, const std::string& name, const std::vector<int64_t>& shape, float* dst);

}  // namespace jtok
