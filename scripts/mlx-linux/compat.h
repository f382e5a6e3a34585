/* Force-included when mlx-c is compiled on Linux (and when its bindings are
 * generated), closing the gaps between mlx-c 0.7 and a Linux toolchain.
 *
 *  - mlx-c's half.h declares float16_t and bfloat16_t only for aarch64, while
 *    mlx-rs refers to both on every target: declare 16-bit storage types with
 *    the same size and alignment.
 *  - mlx-c's private/io.h calls std::format, which libstdc++ before 13 lacks:
 *    provide the small subset it uses ("{}" placeholders, in order).
 */
#pragma once
#include <stdint.h>

#if !defined(__aarch64__) && !defined(HAS_FLOAT16)
#define HAS_FLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
typedef uint16_t float16_t;
#else
typedef __fp16 float16_t;
#endif
typedef uint16_t bfloat16_t;
#endif

#ifdef __cplusplus
#if __has_include(<format>)
#include <format>
#endif
#ifndef __cpp_lib_format
#include <sstream>
#include <string>
#include <string_view>
namespace std {
template <class... Ts>
inline string format(string_view pattern, const Ts&... values) {
  ostringstream text;
  size_t from = 0;
  auto emit = [&](const auto& value) {
    size_t at = pattern.find("{}", from);
    if (at == string_view::npos) return;
    text << pattern.substr(from, at - from) << value;
    from = at + 2;
  };
  (emit(values), ...);
  text << pattern.substr(from);
  return text.str();
}
}  // namespace std
#endif
#endif
