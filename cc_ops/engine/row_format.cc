#include "row_format.h"

#include <cstring>

namespace mxrec {

namespace {

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

bool IsNan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

uint16_t ToBfloat16(uint32_t bits) {
  if (IsNan(bits)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // stays a (quiet) NaN
  // Round to nearest even: add half an ulp of bfloat16, and one more bit when
  // the kept part is odd, then drop the low 16 bits.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// float32 -> float16, round to nearest even (F. Giesen's float_to_half_fast3_rtne):
// exact for every float16 value, which is what the tier stores in the end.
uint16_t ToFloat16(uint32_t bits) {
  const uint32_t sign = bits & 0x80000000u;
  uint32_t magnitude = bits ^ sign;
  uint16_t out;
  if (magnitude >= (127u + 16u) << 23) {  // 2^16 and beyond: infinity, or NaN
    out = IsNan(magnitude)
              ? static_cast<uint16_t>(0x7e00u | ((magnitude >> 13) & 0x3ffu))
              : 0x7c00u;
  } else if (magnitude < 113u << 23) {  // below 2^-14: a subnormal float16 or zero
    // Adding 0.5 aligns the 10 bits of the result at the bottom of the
    // mantissa; the float addition rounds them to nearest even.
    const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    out = static_cast<uint16_t>(Bits(FromBits(magnitude) + FromBits(magic)) - magic);
  } else {
    const uint32_t odd = (magnitude >> 13) & 1u;
    magnitude += ((15u - 127u) << 23) + 0xfffu + odd;  // rebias, round half to even
    out = static_cast<uint16_t>(magnitude >> 13);      // overflow gives 0x7c00: infinity
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float FromFloat16(uint16_t half) {
  const uint32_t shifted_exponent = 0x7c00u << 13;
  uint32_t bits = (half & 0x7fffu) << 13;
  const uint32_t exponent = bits & shifted_exponent;
  bits += (127u - 15u) << 23;
  if (exponent == shifted_exponent) {
    bits += (128u - 16u) << 23;  // infinity or NaN
  } else if (exponent == 0) {    // zero or subnormal: renormalised by a float subtraction
    bits += 1u << 23;
    bits = Bits(FromBits(bits) - FromBits(113u << 23));
  }
  return FromBits(bits | (static_cast<uint32_t>(half & 0x8000u) << 16));
}

}  // namespace

const char* ElementName(ElementType type) {
  switch (type) {
    case ElementType::kBfloat16:
      return "bfloat16";
    case ElementType::kFloat16:
      return "float16";
    default:
      return "float32";
  }
}

bool ParseElementType(const std::string& name, ElementType* type) {
  for (ElementType t : {ElementType::kFloat32, ElementType::kBfloat16, ElementType::kFloat16}) {
    if (name == ElementName(t)) {
      *type = t;
      return true;
    }
  }
  return false;
}

bool EncodeRow(ElementType type, const float* in, int64_t n, char* out) {
  if (type == ElementType::kFloat32) {
    std::memcpy(out, in, static_cast<size_t>(n) * 4);
    return true;
  }
  bool exact = true;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = Bits(in[i]);
    uint16_t half;
    uint32_t back;
    if (type == ElementType::kBfloat16) {
      half = ToBfloat16(bits);
      back = static_cast<uint32_t>(half) << 16;
    } else {
      half = ToFloat16(bits);
      back = Bits(FromFloat16(half));
    }
    exact &= back == bits || (IsNan(bits) && IsNan(back));
    std::memcpy(out + 2 * i, &half, 2);
  }
  return exact;
}

void DecodeRow(ElementType type, const char* in, int64_t n, float* out) {
  if (type == ElementType::kFloat32) {
    std::memmove(out, in, static_cast<size_t>(n) * 4);
    return;
  }
  // From the last value down: widening in place never overwrites a value
  // still to be read (value i's 4 bytes start at byte 4i, those of the values
  // j < i still to be read end by byte 2i).
  for (int64_t i = n - 1; i >= 0; --i) {
    uint16_t half;
    std::memcpy(&half, in + 2 * i, 2);
    const float value = type == ElementType::kBfloat16
                            ? FromBits(static_cast<uint32_t>(half) << 16)
                            : FromFloat16(half);
    std::memcpy(reinterpret_cast<char*>(out) + 4 * i, &value, 4);
  }
}

int64_t RowLayout::ComponentsIn(int64_t bytes) const {
  if (dim <= 0 || bytes < ComponentBytes(0)) return 0;
  return 1 + (bytes - ComponentBytes(0)) / ComponentBytes(1);
}

}  // namespace mxrec
