// FP8 E4M3 / E5M2 encoding and decoding (contract in format.h).
#include "tessera/fp8/format.h"

#include <cmath>
#include <limits>

namespace tessera::fp8 {
namespace {

struct Layout {
  int expBits, manBits, bias;
  bool ieee;  // E5M2: the top exponent is infinity / NaN; E4M3fn: only S.1111.111 is NaN
};

Layout layoutOf(Format f) { return f == Format::E4M3 ? Layout{4, 3, 7, false} : Layout{5, 2, 15, true}; }

uint8_t nanOf(Format f, uint8_t sign) { return static_cast<uint8_t>(sign | (f == Format::E4M3 ? 0x7f : 0x7e)); }
uint8_t infOf(uint8_t sign) { return static_cast<uint8_t>(sign | 0x7c); }  // E5M2 only

}  // namespace

const char* name(Format f) { return f == Format::E4M3 ? "e4m3" : "e5m2"; }
float maxFinite(Format f) { return f == Format::E4M3 ? 448.0f : 57344.0f; }
float minSubnormal(Format f) { return f == Format::E4M3 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -16); }

uint8_t encode(float x, Format f, Overflow o) {
  const Layout L = layoutOf(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return nanOf(f, sign);
  const double a = std::fabs(static_cast<double>(x));  // exact; every step below is exact in double
  const double top = maxFinite(f);
  auto overflow = [&]() -> uint8_t {
    if (o == Overflow::Saturate) return static_cast<uint8_t>(sign | encode(maxFinite(f), f, Overflow::NoSaturate));
    return L.ieee ? infOf(sign) : nanOf(f, sign);
  };
  if (std::isinf(a)) return overflow();
  if (a == 0) return sign;
  // The spacing of representable values at a's binade (subnormal spacing below the normals).
  const int minExp = 1 - L.bias;
  int e = std::ilogb(a);
  if (e < minExp) e = minExp;
  const int quantumExp = e - L.manBits;
  const double steps = std::nearbyint(std::ldexp(a, -quantumExp));  // ties to even (default mode)
  const double v = std::ldexp(steps, quantumExp);
  if (v > top) return overflow();
  if (v == 0) return sign;
  int ve = std::ilogb(v);  // rounding may have carried into the next binade
  if (ve < minExp) {       // subnormal: exponent field 0
    const auto man = static_cast<unsigned>(std::ldexp(v, -(minExp - L.manBits)));
    return static_cast<uint8_t>(sign | man);
  }
  const auto expField = static_cast<unsigned>(ve + L.bias);
  const auto man = static_cast<unsigned>(std::ldexp(v, -ve + L.manBits)) - (1u << L.manBits);
  return static_cast<uint8_t>(sign | (expField << L.manBits) | man);
}

float decode(uint8_t bits, Format f) {
  const Layout L = layoutOf(f);
  const bool neg = (bits & 0x80) != 0;
  const unsigned expField = (bits >> L.manBits) & ((1u << L.expBits) - 1);
  const unsigned man = bits & ((1u << L.manBits) - 1);
  const unsigned topExp = (1u << L.expBits) - 1;
  float v;
  if (L.ieee && expField == topExp) {
    v = man == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!L.ieee && expField == topExp && man == (1u << L.manBits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (expField == 0) {
    v = std::ldexp(static_cast<float>(man), 1 - L.bias - L.manBits);
  } else {
    v = std::ldexp(static_cast<float>((1u << L.manBits) | man), static_cast<int>(expField) - L.bias - L.manBits);
  }
  return neg ? -v : v;
}

}  // namespace tessera::fp8
