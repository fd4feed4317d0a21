// SecretString: a std::string whose buffer comes from libsodium's guarded
// heap (sodium_malloc): locked in memory where the limit allows, kept out of
// core dumps (MADV_DONTDUMP), fenced by guard pages, and zeroed when it is
// freed. For secret keys (their Z85 text and their bytes), so that no copy
// of one reaches ordinary memory, swap or a dump. Strings of at most 15
// characters live inside the object (the short-string buffer): give it
// only longer secrets (a Z85 key is 40 characters, a binary one 32 bytes).
//
// Thread-safety: as std::string; the allocator is stateless.
#ifndef GRADSYNC_WIRE_SECRET_STRING_H_
#define GRADSYNC_WIRE_SECRET_STRING_H_

#include <sodium.h>

#include <cstddef>
#include <new>
#include <string>

namespace gradsync::wire {

template <class T>
struct SecretAllocator {
  using value_type = T;
  SecretAllocator() = default;
  template <class U>
  SecretAllocator(const SecretAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    void* p = sodium_init() < 0 ? nullptr : sodium_allocarray(n, sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { sodium_free(p); }
};

template <class T, class U>
bool operator==(const SecretAllocator<T>&, const SecretAllocator<U>&) {
  return true;
}
template <class T, class U>
bool operator!=(const SecretAllocator<T>&, const SecretAllocator<U>&) {
  return false;
}

using SecretString = std::basic_string<char, std::char_traits<char>, SecretAllocator<char>>;

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SECRET_STRING_H_
