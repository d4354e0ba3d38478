// The arrays a queue keeps its entries in (a QP's send and receive WQEs, an
// SRQ's WQEs, a CQ's completions): from the heap, or from a source the
// application gave (a parent domain's allocators, pd_mr.cpp). Only these
// arrays go through a source; the objects that own them do not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

namespace usrc::rc {

// Which array a source is asked for: the resource_type a parent domain's
// alloc and free are called with (docs/design.md, "Protection, thread and parent domains").
enum class BufferKind : uint64_t { none = 0, send_queue = 1, recv_queue = 2, srq = 3, cq = 4 };

// Every array starts on a cache line.
constexpr size_t kBufferAlign = 64;

struct BufferSource {
  // size bytes aligned to align; nullptr: out of memory; kUseHeap: the
  // heap is to be used instead (and this source is not asked to free it).
  virtual void *alloc(size_t size, size_t align, BufferKind kind) = 0;
  virtual void free(void *p, BufferKind kind) = 0;
  static inline void *const kUseHeap = reinterpret_cast<void *>(-1);

 protected:
  ~BufferSource() = default;
};

// n value-initialized T, owned; move-only. Throws std::bad_alloc when the
// memory cannot be had (memory a source returns not aligned as asked is
// given back to it, and counts as none).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t n, BufferSource *src = nullptr, BufferKind kind = BufferKind::none) : src_(src), kind_(kind) {
    static_assert(alignof(T) <= kBufferAlign);
    const size_t bytes = n * sizeof(T);
    if (n && bytes / n != sizeof(T)) throw std::bad_alloc();
    void *p = src ? src->alloc(bytes, kBufferAlign, kind) : BufferSource::kUseHeap;
    if (p == BufferSource::kUseHeap) {
      p = ::operator new(bytes ? bytes : 1, std::align_val_t(kBufferAlign));
    } else {
      if (!p) throw std::bad_alloc();
      if (reinterpret_cast<uintptr_t>(p) % kBufferAlign) {
        src->free(p, kind);
        throw std::bad_alloc();
      }
      custom_ = true;
    }
    p_ = static_cast<T *>(p);
    n_ = n;
    std::uninitialized_value_construct_n(p_, n_);   // (T's construction does not throw)
  }
  Buffer(Buffer &&o) noexcept { swap(o); }
  Buffer &operator=(Buffer &&o) noexcept {
    Buffer(std::move(o)).swap(*this);
    return *this;
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  ~Buffer() { reset(); }

  void swap(Buffer &o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(src_, o.src_);
    std::swap(kind_, o.kind_);
    std::swap(custom_, o.custom_);
  }
  void reset() noexcept {
    if (!p_) return;
    std::destroy_n(p_, n_);
    if (custom_) src_->free(p_, kind_);
    else ::operator delete(p_, std::align_val_t(kBufferAlign));
    p_ = nullptr;
    n_ = 0;
    custom_ = false;
  }

  T *data() { return p_; }
  const T *data() const { return p_; }
  size_t size() const { return n_; }
  T &operator[](size_t i) { return p_[i]; }
  const T &operator[](size_t i) const { return p_[i]; }
  BufferSource *source() const { return src_; }   // the source asked (even if it chose the heap)
  BufferKind kind() const { return kind_; }
  bool custom() const { return custom_; }          // the memory is the source's

 private:
  T *p_ = nullptr;
  size_t n_ = 0;
  BufferSource *src_ = nullptr;
  BufferKind kind_ = BufferKind::none;
  bool custom_ = false;
};

}  // namespace usrc::rc
