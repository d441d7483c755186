// opreg/detail/text.h: text that goes into opreg's messages. A message reaches Python as a str,
// decoded as UTF-8: one holding other bytes (a name, a path or a C++ exception's what() with a
// 0xff in it) raised UnicodeDecodeError there instead of the error itself.
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>

namespace opreg::detail {

// How many bytes the valid UTF-8 sequence at text[i] (a byte above 0x7f) has, or 0.
inline size_t utf8_sequence_length(std::string_view text, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range (no overlongs, surrogates)
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    low = lead == 0xe0 ? 0xa0 : low;
    high = lead == 0xed ? 0x9f : high;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    low = lead == 0xf0 ? 0x90 : low;
    high = lead == 0xf4 ? 0x8f : high;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = i + 2; k < i + length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xbf) return 0;
  }
  return length;
}

// `text` with each byte that is not part of valid UTF-8 written as \xNN, and the control bytes
// too where `controls` is set, or NUL alone where `nul` is.
inline std::string escape_bytes(std::string_view text, bool controls, bool nul = false) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const bool control = byte < 0x20 || byte == 0x7f;
    const size_t length = byte >= 0x80 ? utf8_sequence_length(text, i)
                                       : ((controls && control) || (nul && byte == 0) ? 0 : 1);
    if (length > 0) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += {'\\', 'x', digits[byte >> 4], digits[byte & 15]};
      ++i;
    }
  }
  return out;
}

// An exception's what(), or words saying it gave none: a user's what() may return a null pointer,
// which read as a C string segfaulted (sweep 51 B-N6). Read once: what() may give a new pointer
// on each call, freeing the last one.
inline const char* what_of(const char* message) noexcept {
  return message != nullptr ? message : "(its what() returned a null pointer)";
}
inline const char* what_of(const std::exception& error) noexcept { return what_of(error.what()); }

// `text` with each byte that is not part of valid UTF-8 written as \xNN.
inline std::string valid_utf8(std::string_view text) { return escape_bytes(text, false); }

// An error message as Python can read it: valid_utf8, and a NUL written \x00 too (a C string
// ends there: the message that reached Python stopped at it, its context lost).
inline std::string readable_message(std::string_view text) {
  return escape_bytes(text, false, true);
}

// `text` with control bytes and bytes that are not UTF-8 written \xNN: a name from a file or a
// user, safe to put in a message on one line.
inline std::string escaped(std::string_view text) { return escape_bytes(text, true); }

}  // namespace opreg::detail
