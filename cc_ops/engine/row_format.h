// How the host and SSD tiers store a table's rows: each component (the
// embedding, then each optimizer slot) in its element type, float32, bfloat16
// or float16 (create_table's storage_dtype for the embedding, slot_dtype for
// the slots). The tiers' interfaces (swaps, reads, checkpoints) stay float32:
// a row is encoded as it enters a tier's storage and decoded as it leaves.
//
// A value that left a half-precision device variable is exactly representable
// in its storage type, so a swap out and back is exact; the swap path checks
// that (EncodeRow's result) and refuses a row that would be rounded, which
// would mean the device variable and the tier disagree on the type. Rows from
// a checkpoint are rounded to nearest (even), as TensorFlow's cast rounds, so
// a float32 checkpoint restores into a half table. Plain C++, no TensorFlow.
#ifndef MXREC_ENGINE_ROW_FORMAT_H_
#define MXREC_ENGINE_ROW_FORMAT_H_

#include <cstdint>
#include <string>

namespace mxrec {

enum class ElementType : uint8_t { kFloat32 = 0, kBfloat16 = 1, kFloat16 = 2 };

inline int64_t ElementBytes(ElementType type) { return type == ElementType::kFloat32 ? 4 : 2; }
// "float32", "bfloat16", "float16".
const char* ElementName(ElementType type);
// The type named `name` (as ElementName gives it); false for any other name.
bool ParseElementType(const std::string& name, ElementType* type);

// n floats of `in` as `type` at `out` (unaligned: n * ElementBytes(type)
// bytes), rounded to nearest (even); NaN stays NaN, values beyond float16's
// range become infinities. Returns whether every value was exact (NaN counts
// as exact).
bool EncodeRow(ElementType type, const float* in, int64_t n, char* out);
// n values of `type` at `in` (unaligned) as floats at `out` (exact). `in` may
// be `out` itself: the values are widened in place.
void DecodeRow(ElementType type, const char* in, int64_t n, float* out);

// The byte layout of one ID's components in a tier: the embedding (component
// 0) in `embedding`, every optimizer slot (1, 2, ...) in `slots`, dim values
// each, one after another.
struct RowLayout {
  int64_t dim = 0;
  ElementType embedding = ElementType::kFloat32;
  ElementType slots = ElementType::kFloat32;

  ElementType type(int component) const { return component == 0 ? embedding : slots; }
  int64_t ComponentBytes(int component) const { return dim * ElementBytes(type(component)); }
  // Where component `component` starts; also the bytes of the components before it.
  int64_t Offset(int component) const {
    return component <= 0 ? 0
                          : dim * (ElementBytes(embedding) +
                                   (component - 1) * ElementBytes(slots));
  }
  // The bytes of `components` components (the host and SSD bytes per ID).
  int64_t Bytes(int64_t components) const { return Offset(static_cast<int>(components)); }
  // The components whose values `bytes` bytes hold in full.
  int64_t ComponentsIn(int64_t bytes) const;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_ROW_FORMAT_H_
