#include "model/checkpoint.h"

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <variant>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

namespace maskd {
namespace {

// a * b and a + b for sizes read from a file, which may be chosen to wrap around.
bool MulOverflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool AddOverflows(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

// ---------------------------------------------------------------------------------------------------
// A restricted pickle machine.

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Global {
  std::string module, name;
  std::string Qualified() const { return module + "." + name; }
};
struct StorageRef {
  std::string key;
  at::ScalarType dtype;
  int64_t numel;
};
struct Mark {};
struct None {};
using List = std::vector<ValuePtr>;
struct Tuple {
  std::vector<ValuePtr> items;
};
struct Dict {
  std::vector<std::pair<ValuePtr, ValuePtr>> items;
};

struct Value {
  std::variant<None, Mark, bool, int64_t, double, std::string, Tuple, List, Dict, Global, StorageRef,
               at::Tensor>
      v;
};

template <typename T>
ValuePtr Make(T x) {
  auto p = std::make_shared<Value>();
  p->v = std::move(x);
  return p;
}

class PickleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The storage classes torch.save names in its persistent ids.
bool StorageDtype(const std::string& name, at::ScalarType* dtype) {
  static const std::map<std::string, at::ScalarType> kStorages = {
      {"FloatStorage", at::kFloat},   {"DoubleStorage", at::kDouble}, {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},   {"CharStorage", at::kChar},     {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool},
  };
  auto it = kStorages.find(name);
  if (it == kStorages.end()) return false;
  *dtype = it->second;
  return true;
}

bool IsAllowedCallable(const Global& g) {
  return (g.module == "collections" && g.name == "OrderedDict") ||
         (g.module == "torch._utils" &&
          (g.name == "_rebuild_tensor_v2" || g.name == "_rebuild_tensor" ||
           g.name == "_rebuild_parameter"));
}

class Unpickler {
 public:
  // `load_storage(key, dtype, numel)` returns the storage's data as a 1-D tensor.
  Unpickler(const char* data, size_t size,
            std::function<at::Tensor(const std::string&, at::ScalarType, int64_t)> load_storage)
      : p_(data), end_(data + size), load_storage_(std::move(load_storage)) {}

  ValuePtr Run() {
    while (true) {
      const uint8_t op = Byte();
      switch (op) {
        case 0x80: Byte(); break;                 // PROTO
        case 0x95: Skip(8); break;                // FRAME (protocol 4)
        case '.': return Pop();                   // STOP
        case '(': stack_.push_back(Make(Mark{})); break;  // MARK
        case '0': Pop(); break;                   // POP
        case '1': PopMark(); break;               // POP_MARK
        case '2': stack_.push_back(Top()); break;  // DUP
        case 'N': stack_.push_back(Make(None{})); break;
        case 0x88: stack_.push_back(Make(true)); break;   // NEWTRUE
        case 0x89: stack_.push_back(Make(false)); break;  // NEWFALSE
        case 'J': stack_.push_back(Make(static_cast<int64_t>(ReadLE<int32_t>()))); break;  // BININT
        case 'K': stack_.push_back(Make(static_cast<int64_t>(Byte()))); break;  // BININT1
        case 'M': stack_.push_back(Make(static_cast<int64_t>(ReadLE<uint16_t>()))); break;  // BININT2
        case 0x8a: {  // LONG1
          const int n = Byte();
          if (n > 8) throw PickleError("integer wider than 64 bits");
          uint64_t u = 0;
          for (int i = 0; i < n; ++i) u |= static_cast<uint64_t>(Byte()) << (8 * i);
          if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t{0} << (8 * n);  // sign
          stack_.push_back(Make(static_cast<int64_t>(u)));
          break;
        }
        case 'G': {  // BINFLOAT (big-endian double)
          uint64_t u = 0;
          for (int i = 0; i < 8; ++i) u = (u << 8) | Byte();
          double d;
          std::memcpy(&d, &u, 8);
          stack_.push_back(Make(d));
          break;
        }
        case 'X': stack_.push_back(Make(Str(ReadLE<uint32_t>()))); break;  // BINUNICODE
        case 0x8c: stack_.push_back(Make(Str(Byte()))); break;             // SHORT_BINUNICODE
        case 0x8d: stack_.push_back(Make(Str(ReadLE<uint64_t>()))); break;  // BINUNICODE8
        case 'T': stack_.push_back(Make(Str(ReadLE<uint32_t>()))); break;  // BINSTRING
        case 'U': stack_.push_back(Make(Str(Byte()))); break;              // SHORT_BINSTRING
        case 'B': stack_.push_back(Make(Str(ReadLE<uint32_t>()))); break;  // BINBYTES
        case 'C': stack_.push_back(Make(Str(Byte()))); break;              // SHORT_BINBYTES
        case ')': stack_.push_back(Make(Tuple{})); break;                  // EMPTY_TUPLE
        case 't': stack_.push_back(Make(Tuple{PopMark()})); break;         // TUPLE
        case 0x85: stack_.push_back(Make(Tuple{PopN(1)})); break;          // TUPLE1
        case 0x86: stack_.push_back(Make(Tuple{PopN(2)})); break;          // TUPLE2
        case 0x87: stack_.push_back(Make(Tuple{PopN(3)})); break;          // TUPLE3
        case ']': stack_.push_back(Make(List{})); break;                   // EMPTY_LIST
        case 'a': {  // APPEND
          ValuePtr v = Pop();
          AsList(Top()).push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          auto items = PopMark();
          auto& l = AsList(Top());
          l.insert(l.end(), items.begin(), items.end());
          break;
        }
        case '}': stack_.push_back(Make(Dict{})); break;  // EMPTY_DICT
        case 's': {                                      // SETITEM
          ValuePtr v = Pop(), k = Pop();
          AsDict(Top()).items.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          auto items = PopMark();
          if (items.size() % 2) throw PickleError("SETITEMS with an odd number of items");
          auto& d = AsDict(Top());
          for (size_t i = 0; i < items.size(); i += 2) d.items.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          Global g;
          g.module = Line();
          g.name = Line();
          stack_.push_back(Make(CheckGlobal(g)));
          break;
        }
        case 'i': {  // INST "module\nname\n": calls that global with the arguments above a MARK
          Global g;
          g.module = Line();
          g.name = Line();
          throw PickleError("the pickle calls the global '" + g.Qualified() +
                            "' through INST (opcode 0x69), which a tensor state dict does not use; "
                            "refusing to load it (a checkpoint is never allowed to run code)");
        }
        case 'o':     // OBJ
        case 0x81:    // NEWOBJ
        case 0x92: {  // NEWOBJ_EX
          std::ostringstream os;
          os << "the pickle creates an object of an arbitrary class (opcode 0x" << std::hex << int(op)
             << "), which a tensor state dict does not use; refusing to load it (a checkpoint is "
                "never allowed to run code)";
          throw PickleError(os.str());
        }
        case 0x93: {  // STACK_GLOBAL
          ValuePtr name = Pop(), module = Pop();
          stack_.push_back(Make(CheckGlobal(Global{AsStr(module), AsStr(name)})));
          break;
        }
        case 'q': memo_[Byte()] = Top(); break;               // BINPUT
        case 'r': memo_[ReadLE<uint32_t>()] = Top(); break;   // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = Top(); break;        // MEMOIZE
        case 'h': stack_.push_back(Memo(Byte())); break;      // BINGET
        case 'j': stack_.push_back(Memo(ReadLE<uint32_t>())); break;  // LONG_BINGET
        case 'Q': stack_.push_back(PersistentLoad(Pop())); break;     // BINPERSID
        case 'R': {                                                   // REDUCE
          ValuePtr args = Pop(), fn = Pop();
          stack_.push_back(Reduce(fn, args));
          break;
        }
        case 'b': {  // BUILD: only an OrderedDict's attribute dict (state_dict._metadata) is accepted
          ValuePtr state = Pop();
          if (!std::holds_alternative<Dict>(Top()->v) || !std::holds_alternative<Dict>(state->v))
            throw PickleError("BUILD on something other than a dict (not a state dict)");
          break;  // the metadata (per-module versions) does not change the tensors
        }
        default: {
          std::ostringstream os;
          os << "unsupported pickle opcode 0x" << std::hex << int(op) << " at byte "
             << std::dec << (p_ - 1 - start_) << " (not a plain tensor state dict)";
          throw PickleError(os.str());
        }
      }
    }
  }

 private:
  uint8_t Byte() {
    if (p_ >= end_) throw PickleError("pickle data ends before STOP (truncated)");
    return static_cast<uint8_t>(*p_++);
  }
  void Skip(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw PickleError("pickle data truncated");
    p_ += n;
  }
  template <typename T>
  T ReadLE() {
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(Byte()) << (8 * i));
    return v;
  }
  std::string Str(uint64_t n) {
    if (static_cast<uint64_t>(end_ - p_) < n) throw PickleError("pickle string runs past the end");
    std::string s(p_, p_ + n);
    p_ += n;
    return s;
  }
  std::string Line() {
    const char* nl = static_cast<const char*>(std::memchr(p_, '\n', end_ - p_));
    if (!nl) throw PickleError("unterminated GLOBAL name");
    std::string s(p_, nl);
    p_ = nl + 1;
    return s;
  }
  ValuePtr Pop() {
    if (stack_.empty()) throw PickleError("pickle stack underflow");
    ValuePtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr& Top() {
    if (stack_.empty()) throw PickleError("pickle stack underflow");
    return stack_.back();
  }
  std::vector<ValuePtr> PopN(size_t n) {
    if (stack_.size() < n) throw PickleError("pickle stack underflow");
    std::vector<ValuePtr> items(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    return items;
  }
  std::vector<ValuePtr> PopMark() {
    for (size_t i = stack_.size(); i-- > 0;) {
      if (std::holds_alternative<Mark>(stack_[i]->v)) {
        std::vector<ValuePtr> items(stack_.begin() + i + 1, stack_.end());
        stack_.resize(i);
        return items;
      }
    }
    throw PickleError("pickle MARK not found");
  }
  ValuePtr Memo(uint64_t i) {
    auto it = memo_.find(i);
    if (it == memo_.end()) throw PickleError("pickle memo entry " + std::to_string(i) + " missing");
    return it->second;
  }
  static List& AsList(ValuePtr& v) {
    if (auto* l = std::get_if<List>(&v->v)) return *l;
    throw PickleError("APPEND to something that is not a list");
  }
  static Dict& AsDict(ValuePtr& v) {
    if (auto* d = std::get_if<Dict>(&v->v)) return *d;
    throw PickleError("SETITEM on something that is not a dict");
  }
  static const std::string& AsStr(const ValuePtr& v) {
    if (auto* s = std::get_if<std::string>(&v->v)) return *s;
    throw PickleError("expected a string in the pickle");
  }
  static int64_t AsInt(const ValuePtr& v, const char* what) {
    if (auto* i = std::get_if<int64_t>(&v->v)) return *i;
    throw PickleError(std::string("expected an integer for ") + what);
  }
  static std::vector<int64_t> AsInts(const ValuePtr& v, const char* what) {
    auto* t = std::get_if<Tuple>(&v->v);
    if (!t) throw PickleError(std::string("expected a tuple for ") + what);
    std::vector<int64_t> out;
    for (auto& x : t->items) out.push_back(AsInt(x, what));
    return out;
  }

  Global CheckGlobal(const Global& g) {
    at::ScalarType dtype;
    if (g.module == "torch" && StorageDtype(g.name, &dtype)) return g;
    if (IsAllowedCallable(g)) return g;
    throw PickleError("the pickle references the global '" + g.Qualified() +
                      "', which a tensor state dict does not need; refusing to load it (a "
                      "checkpoint is never allowed to run code)");
  }

  ValuePtr PersistentLoad(const ValuePtr& pid) {
    auto* t = std::get_if<Tuple>(&pid->v);
    if (!t || t->items.size() != 5 || AsStr(t->items[0]) != "storage")
      throw PickleError("persistent id is not ('storage', type, key, location, numel)");
    auto* g = std::get_if<Global>(&t->items[1]->v);
    at::ScalarType dtype;
    if (!g || g->module != "torch" || !StorageDtype(g->name, &dtype))
      throw PickleError("unknown storage type in persistent id");
    const std::string key = AsStr(t->items[2]);
    const int64_t numel = AsInt(t->items[4], "storage size");
    if (numel < 0) throw PickleError("negative storage size");
    auto it = storages_.find(key);
    if (it == storages_.end()) it = storages_.emplace(key, load_storage_(key, dtype, numel)).first;
    return Make(StorageRef{key, dtype, numel});
  }

  ValuePtr Reduce(const ValuePtr& fn, const ValuePtr& args) {
    auto* g = std::get_if<Global>(&fn->v);
    auto* a = std::get_if<Tuple>(&args->v);
    if (!g || !a || !IsAllowedCallable(*g)) throw PickleError("REDUCE of a non-callable value");
    if (g->name == "OrderedDict") {
      if (!a->items.empty()) throw PickleError("OrderedDict called with arguments");
      return Make(Dict{});
    }
    if (g->name == "_rebuild_parameter") {
      if (a->items.empty() || !std::holds_alternative<at::Tensor>(a->items[0]->v))
        throw PickleError("_rebuild_parameter without a tensor");
      return a->items[0];
    }
    // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
    // _rebuild_tensor(storage, offset, size, stride)
    if (a->items.size() < 4) throw PickleError("tensor rebuild with too few arguments");
    auto* s = std::get_if<StorageRef>(&a->items[0]->v);
    if (!s) throw PickleError("tensor rebuild without a storage");
    const int64_t offset = AsInt(a->items[1], "storage offset");
    const auto size = AsInts(a->items[2], "tensor size");
    const auto stride = AsInts(a->items[3], "tensor stride");
    if (size.size() != stride.size()) throw PickleError("tensor size and stride differ in rank");
    // Bounds: the furthest element must lie inside the storage. Sizes and strides come from the
    // file, so every product and sum is checked for overflow.
    int64_t last = offset;
    int64_t numel = 1;
    bool empty = false;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] < 0 || stride[i] < 0) throw PickleError("negative tensor size or stride");
      if (size[i] == 0) empty = true;
    }
    for (size_t i = 0; i < size.size() && !empty; ++i) {
      int64_t reach = 0;
      if (MulOverflows(size[i] - 1, stride[i], &reach) || AddOverflows(last, reach, &last) ||
          MulOverflows(numel, size[i], &numel))
        throw PickleError("a tensor's size or stride overflows 64 bits");
    }
    const at::Tensor& storage = storages_.at(s->key);
    if (!empty && (offset < 0 || last >= storage.numel()))
      throw PickleError("a tensor reaches past its storage of " +
                        std::to_string(storage.numel()) + " elements");
    // Zero or overlapping strides would make .contiguous() (in ToStateDict) allocate more than the file
    // holds (16 bytes could ask for gigabytes); a saved state dict never has them.
    if (!empty && numel > storage.numel())
      throw PickleError("a tensor of " + std::to_string(numel) + " elements views a storage of " +
                        std::to_string(storage.numel()) +
                        " (zero or overlapping strides; expected a tensor no larger than its "
                        "storage)");
    if (empty) return Make(at::empty(size, storage.options()));
    // A view until the storages are read (ToStateDict makes it contiguous); the checks above
    // bound what .contiguous() can allocate.
    return Make(storage.as_strided(size, stride, offset));
  }

  const char* p_;
  const char* const end_;
  const char* const start_ = p_;
  std::function<at::Tensor(const std::string&, at::ScalarType, int64_t)> load_storage_;
  std::vector<ValuePtr> stack_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
};

StatusOr<StateDict> ToStateDict(const ValuePtr& root, const std::string& path) {
  auto* d = std::get_if<Dict>(&root->v);
  if (!d) return InvalidArgument(path + ": the pickled object is not a dict of tensors");
  StateDict out;
  for (auto& [k, v] : d->items) {
    auto* name = std::get_if<std::string>(&k->v);
    if (!name) return InvalidArgument(path + ": a state-dict key is not a string");
    auto* t = std::get_if<at::Tensor>(&v->v);
    if (!t) return InvalidArgument(path + ": entry '" + *name + "' is not a tensor");
    out.emplace_back(*name, t->contiguous());
  }
  return out;
}

bool ReadPrefix(const std::string& path, char* buf, size_t n, size_t* got, uint64_t* file_size) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return false;
  *file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  f.read(buf, static_cast<std::streamsize>(n));
  *got = static_cast<size_t>(f.gcount());
  return true;
}

uint64_t LE(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// Record name (below the archive's top folder) -> CRC-32 from the zip central directory (zip64
// too). miniz as built into LibTorch does not check CRCs, so a checkpoint corrupted in the middle
// would load and serve; ReadTorchZip checks every record it reads against these.
struct ZipEntry {
  uint32_t crc = 0;
  uint16_t method = 0;  // 0: stored (what torch.save writes), 8: deflated
};

// A central-directory entry's sizes of 0xffffffff are in its zip64 extra field (id 1): the
// uncompressed size first, then the compressed, each present only where the 32-bit one is
// 0xffffffff. False when that field is missing or short.
bool Zip64Sizes(const unsigned char* extra, uint64_t len, uint64_t* unpacked, uint64_t* packed) {
  if (*unpacked != 0xffffffff && *packed != 0xffffffff) return true;
  for (uint64_t at = 0; at + 4 <= len;) {
    const uint64_t id = LE(extra + at, 2), n = LE(extra + at + 2, 2);
    if (at + 4 + n > len) return false;
    if (id == 1) {
      uint64_t k = at + 4;
      for (uint64_t* v : {unpacked, packed}) {
        if (*v != 0xffffffff) continue;
        if (k + 8 > at + 4 + n) return false;
        *v = LE(extra + k, 8);
        k += 8;
      }
      return true;
    }
    at += 4 + n;
  }
  return false;
}

StatusOr<std::unordered_map<std::string, ZipEntry>> ReadZipCrcs(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return InvalidArgument(path + ": cannot open the checkpoint file");
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  auto read_at = [&](uint64_t at, uint64_t n, std::string* out) {
    if (at > size || n > size - at) return false;
    out->assign(n, '\0');
    f.seekg(static_cast<std::streamoff>(at));
    return static_cast<bool>(f.read(out->data(), static_cast<std::streamsize>(n)));
  };
  const Status corrupt = InvalidArgument(path + ": the zip central directory is corrupt");
  // The end-of-central-directory record: 22 bytes plus a comment of up to 65535.
  const uint64_t tail_len = std::min<uint64_t>(size, 22 + 65535);
  std::string tail;
  if (!read_at(size - tail_len, tail_len, &tail) || tail_len < 22) return corrupt;
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_len) - 22; i >= 0; --i) {
    if (LE(t + i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) return corrupt;
  uint64_t entries = LE(t + eocd + 10, 2), cd_size = LE(t + eocd + 12, 4),
           cd_offset = LE(t + eocd + 16, 4);
  if (entries == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
    // zip64: a locator just before the record points at the zip64 end record.
    const uint64_t eocd_at = size - tail_len + static_cast<uint64_t>(eocd);
    std::string loc, rec;
    if (eocd_at < 20 || !read_at(eocd_at - 20, 20, &loc)) return corrupt;
    const auto* l = reinterpret_cast<const unsigned char*>(loc.data());
    if (LE(l, 4) != 0x07064b50 || !read_at(LE(l + 8, 8), 56, &rec)) return corrupt;
    const auto* r = reinterpret_cast<const unsigned char*>(rec.data());
    if (LE(r, 4) != 0x06064b50) return corrupt;
    entries = LE(r + 32, 8), cd_size = LE(r + 40, 8), cd_offset = LE(r + 48, 8);
  }
  std::string cd;
  if (!read_at(cd_offset, cd_size, &cd)) return corrupt;
  std::unordered_map<std::string, ZipEntry> crcs;
  const auto* c = reinterpret_cast<const unsigned char*>(cd.data());
  uint64_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (cd_size - at < 46 || LE(c + at, 4) != 0x02014b50) return corrupt;
    const uint64_t name_len = LE(c + at + 28, 2), extra_len = LE(c + at + 30, 2),
                   comment_len = LE(c + at + 32, 2);
    if (cd_size - at - 46 < name_len + extra_len + comment_len) return corrupt;
    std::string name(reinterpret_cast<const char*>(c + at + 46), name_len);
    // The reader allocates an entry's declared uncompressed size before reading it, so a lying
    // size must be refused here: a stored entry cannot be larger than the file, a deflated one
    // cannot expand more than deflate's 1032:1.
    const uint16_t method = static_cast<uint16_t>(LE(c + at + 10, 2));
    uint64_t packed = LE(c + at + 20, 4), unpacked = LE(c + at + 24, 4);
    if (!Zip64Sizes(c + at + 46 + name_len, extra_len, &unpacked, &packed)) return corrupt;
    const uint64_t most = method == 0 ? size : std::min<uint64_t>(packed, size) * 1032 + 1024;
    if (unpacked > most)
      return InvalidArgument(path + ": zip entry " + name + " declares " + std::to_string(unpacked) +
                             " bytes, more than a " + std::to_string(size) +
                             "-byte file can hold (corrupt or hostile archive)");
    // Records are addressed below the top folder (named after the file, or "archive").
    const size_t slash = name.find('/');
    crcs[slash == std::string::npos ? name : name.substr(slash + 1)] =
        ZipEntry{static_cast<uint32_t>(LE(c + at + 16, 4)), method};
    at += 46 + name_len + extra_len + comment_len;
  }
  return crcs;
}

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  for (size_t done = 0; done < n;) {  // crc32 takes a 32-bit length
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n - done, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p + done, chunk));
    done += chunk;
  }
  return crc;
}

const ZipEntry& EntryOf(const std::unordered_map<std::string, ZipEntry>& crcs, const std::string& rec) {
  auto it = crcs.find(rec);
  if (it == crcs.end()) throw PickleError("record " + rec + " is not in the zip central directory");
  return it->second;
}

std::string CrcMismatch(const std::string& rec, uint32_t crc, uint32_t expected) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "CRC-32 %08x, expected %08x", static_cast<unsigned>(crc),
                static_cast<unsigned>(expected));
  return "record " + rec + " is corrupt (" + buf + " from the zip directory)";
}

void CheckRecordCrc(const std::unordered_map<std::string, ZipEntry>& crcs, const std::string& rec,
                    const void* data, size_t n) {
  const uint32_t expected = EntryOf(crcs, rec).crc;
  const uint32_t crc = Crc32(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), data, n);
  if (crc != expected) throw PickleError(CrcMismatch(rec, crc, expected));
}

// One storage record to read into its tensor: `bytes` of it are the tensor's, `have` >= bytes in
// the file (the CRC covers all of them).
struct RecordJob {
  std::string rec;
  at::Tensor tensor;
  uint64_t bytes = 0, have = 0;
  uint64_t offset = 0;  // of the record's data in the file (stored records only)
  uint32_t crc = 0;
  bool stored = true;
  std::string error;
};

// Reads [offset, offset + n) of the file into `dst` in chunks, extending `crc` over each chunk while
// it is still in cache. False on a short read (sets `error`).
bool ReadRange(int fd, uint64_t offset, char* dst, uint64_t n, uint32_t* crc, std::string* error) {
  constexpr uint64_t kChunk = 4u << 20;
  for (uint64_t done = 0; done < n;) {
    const uint64_t want = std::min(kChunk, n - done);
    const ssize_t got = ::pread(fd, dst + done, want, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      *error = got < 0 ? std::string(std::strerror(errno)) : std::string("the file ends early (truncated?)");
      return false;
    }
    *crc = Crc32(*crc, dst + done, static_cast<uint64_t>(got));
    done += static_cast<uint64_t>(got);
  }
  return true;
}

// Reads one stored record straight from the file into its tensor (a record longer than the tensor
// also has its rest read, for the CRC). Sets job.error instead of throwing (worker threads).
void ReadStoredRecord(int fd, uint64_t file_size, RecordJob& job) {
  if (job.offset > file_size || job.have > file_size - job.offset) {
    job.error = "storage record " + job.rec + " runs past the end of the file (truncated?)";
    return;
  }
  uint32_t crc = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  std::string why;
  bool ok = ReadRange(fd, job.offset, job.bytes ? static_cast<char*>(job.tensor.data_ptr()) : nullptr,
                      job.bytes, &crc, &why);
  if (ok && job.have > job.bytes) {
    std::vector<char> rest(job.have - job.bytes);
    ok = ReadRange(fd, job.offset + job.bytes, rest.data(), rest.size(), &crc, &why);
  }
  if (!ok) {
    job.error = "storage record " + job.rec + " could not be read: " + why;
  } else if (crc != job.crc) {
    job.error = CrcMismatch(job.rec, crc, job.crc);
  }
}

// Reads every stored record on a few threads (each record's CRC on the thread that read it), the
// largest first so that the threads finish together. The first failing record in file order is
// reported, whichever thread saw it first.
void ReadStoredRecords(const std::string& path, std::vector<RecordJob>& jobs) {
  std::vector<size_t> order;
  uint64_t total = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].stored) order.push_back(i), total += jobs[i].have;
  }
  if (order.empty()) return;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return jobs[a].have > jobs[b].have; });
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw PickleError(std::string("cannot reopen the file: ") + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  // Reading from the page cache and the CRC scale with cores; below ~32 MB a thread is not worth it.
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::max<size_t>(1, std::min<size_t>({hw, 16, order.size(), total / (32u << 20) + 1}));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) ReadStoredRecord(fd, file_size, jobs[order[k]]);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  ::close(fd);
  for (const auto& j : jobs)
    if (!j.error.empty()) throw PickleError(j.error);
}

StatusOr<StateDict> ReadTorchZip(const std::string& path) {
  StatusOr<std::unordered_map<std::string, ZipEntry>> crcs = ReadZipCrcs(path);
  if (!crcs.ok()) return crcs.status();
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    // The archive's top folder (file stem or "archive") is handled by the reader; records are
    // addressed relative to it.
    if (!reader.hasRecord("data.pkl"))
      return InvalidArgument(path + ": zip archive without data.pkl (not a torch.save checkpoint)");
    auto [pkl, pkl_size] = reader.getRecord("data.pkl");
    CheckRecordCrc(*crcs, "data.pkl", pkl.get(), pkl_size);
    // The pickle names the storages and sizes; each gets an uninitialised tensor here and is read
    // after the pickle, all records at once (the tensors built from them are views until then).
    std::vector<RecordJob> jobs;
    auto load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
      const std::string rec = "data/" + key;
      if (!reader.hasRecord(rec)) throw PickleError("storage record " + rec + " is missing");
      const size_t elem = c10::elementSize(dtype);
      const size_t have = reader.getRecordSize(rec);
      if (static_cast<uint64_t>(numel) > have / elem)
        throw PickleError("storage record " + rec + " holds " + std::to_string(have) +
                          " bytes, expected " + std::to_string(numel) + " elements of " +
                          std::to_string(elem) + " bytes");
      const ZipEntry& entry = EntryOf(*crcs, rec);
      RecordJob job;
      job.rec = rec;
      job.bytes = static_cast<uint64_t>(numel) * elem;
      job.have = have;
      job.crc = entry.crc;
      job.stored = entry.method == 0;
      if (job.stored && have) job.offset = reader.getRecordOffset(rec);
      job.tensor = at::empty({numel}, at::TensorOptions().dtype(dtype));
      jobs.push_back(job);
      return job.tensor;
    };
    Unpickler u(static_cast<const char*>(pkl.get()), pkl_size, load);
    ValuePtr root = u.Run();
    // Compressed records (not written by torch.save, but valid zip) go through the zip reader.
    for (auto& job : jobs) {
      if (job.stored) continue;
      auto [all, all_size] = reader.getRecord(job.rec);
      CheckRecordCrc(*crcs, job.rec, all.get(), all_size);
      if (job.bytes) std::memcpy(job.tensor.data_ptr(), all.get(), job.bytes);
    }
    ReadStoredRecords(path, jobs);
    return ToStateDict(root, path);
  } catch (const PickleError& e) {
    return InvalidArgument(path + ": " + e.what());
  } catch (const c10::Error& e) {
    return InvalidArgument(path + ": not a readable torch.save archive (truncated or corrupt?): " +
                           e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": cannot read: " + e.what());
  }
}

StatusOr<StateDict> ReadSafetensors(const std::string& path, uint64_t file_size) {
  std::ifstream f(path, std::ios::binary);
  uint64_t header_len = 0;
  unsigned char len_bytes[8];
  if (!f.read(reinterpret_cast<char*>(len_bytes), 8))
    return InvalidArgument(path + ": truncated safetensors file");
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  if (header_len > file_size - 8 || header_len > (100u << 20))
    return InvalidArgument(path + ": safetensors header length " + std::to_string(header_len) +
                           " exceeds the file");
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const uint64_t data_start = 8 + header_len;
  static const std::map<std::string, at::ScalarType> kDtypes = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},  {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},   {"BOOL", at::kBool}};
  try {
    const auto j = nlohmann::json::parse(header);
    if (!j.is_object()) return InvalidArgument(path + ": safetensors header is not a JSON object");
    // Sort by data offset so that the file is read front to back, but keep header order for names.
    StateDict out;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const auto& e = it.value();
      const std::string dt = e.at("dtype").get<std::string>();
      auto d = kDtypes.find(dt);
      if (d == kDtypes.end())
        return InvalidArgument(path + ": tensor '" + it.key() + "' has unsupported dtype " + dt);
      // Integers only: JSON reads 1e28 or 3.5 as a double, whose conversion to an integer type is
      // undefined (the checkpoint fuzzer found 1e28 in data_offsets). Shape entries must fit int64
      // (a negative one is refused below), offsets uint64.
      const auto refuse = [&](const char* field, const nlohmann::json& x, const char* expected) {
        return InvalidArgument(path + ": tensor '" + it.key() + "' has a " + field + " entry " + x.dump() +
                               " that is not " + expected);
      };
      const auto& shape_json = e.at("shape");
      const auto& off_json = e.at("data_offsets");
      if (!shape_json.is_array() || !off_json.is_array())
        return InvalidArgument(path + ": tensor '" + it.key() + "' has a shape or data offsets that are not arrays");
      std::vector<int64_t> shape;
      for (const auto& x : shape_json) {
        if (!x.is_number_integer() ||
            (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
          return refuse("shape", x, "a 64-bit integer");
        shape.push_back(x.get<int64_t>());
      }
      std::vector<uint64_t> off;
      for (const auto& x : off_json) {
        if (!x.is_number_unsigned())  // nlohmann: the non-negative integers
          return refuse("data offsets", x, "a non-negative 64-bit integer");
        off.push_back(x.get<uint64_t>());
      }
      int64_t numel = 1;
      for (auto s : shape) {
        if (s < 0) return InvalidArgument(path + ": tensor '" + it.key() + "' has a negative size");
        if (MulOverflows(numel, s, &numel))
          return InvalidArgument(path + ": tensor '" + it.key() +
                                 "' has a shape whose element count overflows 64 bits");
      }
      int64_t signed_bytes = 0;
      if (MulOverflows(numel, static_cast<int64_t>(c10::elementSize(d->second)), &signed_bytes))
        return InvalidArgument(path + ": tensor '" + it.key() +
                               "' has a shape whose byte size overflows 64 bits");
      const uint64_t bytes = static_cast<uint64_t>(signed_bytes);
      // Compared without adding to data_start, which offsets near 2^64 would wrap around.
      if (off.size() != 2 || off[1] < off[0] || off[1] - off[0] != bytes ||
          off[1] > file_size - data_start)
        return InvalidArgument(path + ": tensor '" + it.key() +
                               "' has data offsets that do not match its shape or the file size "
                               "(truncated file?)");
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(d->second));
      f.seekg(static_cast<std::streamoff>(data_start + off[0]));
      if (bytes && !f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes)))
        return InvalidArgument(path + ": truncated data for tensor '" + it.key() + "'");
      out.emplace_back(it.key(), t);
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": bad safetensors header: " + e.what());
  } catch (const c10::Error& e) {
    return InvalidArgument(path + ": cannot read the safetensors data: " +
                           e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": cannot read the safetensors data: " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------------
// Writing: the pickle torch.save produces for an OrderedDict of tensors (protocol 2).

class Pickler {
 public:
  void Proto() { Op(0x80), Op(2); }
  void Op(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void Global(const std::string& module, const std::string& name) {
    Op('c');
    out_ += module + "\n" + name + "\n";
  }
  void Unicode(const std::string& s) {
    Op('X');
    U32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      Op('K'), Op(static_cast<uint8_t>(v));
    } else if (v >= 0 && v < 65536) {
      Op('M'), Op(v & 0xff), Op((v >> 8) & 0xff);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      Op('J');
      U32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      Op(0x8a), Op(8);
      for (int i = 0; i < 8; ++i) Op(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    }
  }
  void IntTuple(const std::vector<int64_t>& v) {
    Op('(');
    for (auto x : v) Int(x);
    Op('t');
  }
  const std::string& bytes() const { return out_; }

 private:
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) Op(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::string out_;
};

const char* StorageName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "FloatStorage";
    case at::kDouble: return "DoubleStorage";
    case at::kHalf: return "HalfStorage";
    case at::kBFloat16: return "BFloat16Storage";
    case at::kLong: return "LongStorage";
    case at::kInt: return "IntStorage";
    case at::kShort: return "ShortStorage";
    case at::kChar: return "CharStorage";
    case at::kByte: return "ByteStorage";
    case at::kBool: return "BoolStorage";
    default: return nullptr;
  }
}

}  // namespace

StatusOr<StateDict> ReadStateDict(const std::string& path) {
  char magic[8] = {};
  size_t got = 0;
  uint64_t size = 0;
  if (!ReadPrefix(path, magic, sizeof magic, &got, &size))
    return InvalidArgument(path + ": cannot open the checkpoint file");
  if (got < 8) return InvalidArgument(path + ": file too short to be a checkpoint (" +
                                      std::to_string(size) + " bytes)");
  if (magic[0] == 'P' && magic[1] == 'K') return ReadTorchZip(path);
  // safetensors: 8-byte little-endian header length, then a JSON object. Checked before the legacy
  // pickle's 0x80 (PROTO): a header length of 128, 384, ... also starts with that byte.
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<uint8_t>(magic[i])) << (8 * i);
  if (header_len > 0 && header_len < size) {
    std::ifstream f(path, std::ios::binary);
    f.seekg(8);
    char c = 0;
    f.get(c);
    if (c == '{') return ReadSafetensors(path, size);
  }
  if (static_cast<uint8_t>(magic[0]) == 0x80)
    return InvalidArgument(path + ": legacy (pre-1.6, non-zip) torch.save format is not supported; "
                                  "re-save it with torch.save in torch >= 1.6");
  return InvalidArgument(path + ": not a checkpoint (neither a torch.save zip archive nor "
                                "safetensors)");
}

Status WriteStateDict(const StateDict& tensors, const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    Pickler p;
    p.Proto();
    p.Global("collections", "OrderedDict");
    p.Op(')');
    p.Op('R');
    p.Op('(');
    int key = 0;
    for (const auto& [name, t0] : tensors) {
      const char* storage = StorageName(t0.scalar_type());
      if (!storage) return InvalidArgument("cannot write tensor '" + name + "' of dtype " +
                                           std::string(c10::toString(t0.scalar_type())));
      at::Tensor t = t0.to(at::kCPU).contiguous();
      const std::string k = std::to_string(key++);
      writer.writeRecord("data/" + k, t.data_ptr(), t.nbytes());
      p.Unicode(name);
      p.Global("torch._utils", "_rebuild_tensor_v2");
      p.Op('(');
      p.Op('(');
      p.Unicode("storage");
      p.Global("torch", storage);
      p.Unicode(k);
      p.Unicode("cpu");
      p.Int(t.numel());
      p.Op('t');
      p.Op('Q');
      p.Int(0);
      p.IntTuple(t.sizes().vec());
      p.IntTuple(t.strides().vec());
      p.Op(0x89);
      p.Global("collections", "OrderedDict");
      p.Op(')');
      p.Op('R');
      p.Op('t');
      p.Op('R');
    }
    p.Op('u');
    // state_dict()._metadata, as torch.save writes it (empty: no per-module versions).
    p.Op('}');
    p.Unicode("_metadata");
    p.Global("collections", "OrderedDict");
    p.Op(')');
    p.Op('R');
    p.Op('s');
    p.Op('b');
    p.Op('.');
    writer.writeRecord("data.pkl", p.bytes().data(), p.bytes().size());
    writer.writeRecord("byteorder", "little", 6);
    writer.writeEndOfFile();
    return Status::Ok();
  } catch (const c10::Error& e) {
    return Internal(path + ": cannot write checkpoint: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal(path + ": cannot write checkpoint: " + e.what());
  }
}

}  // namespace maskd
