// The pickle walk of pickle_storages.h: Python's pickle opcodes (Lib/pickletools.py lists them with
// their arguments) run on a stack of values that are kept only as far as a storage tuple needs:
// strings, integers, globals and tuples; everything else is an opaque "other". Memo entries are shared,
// so a tuple fetched twice costs a pointer.
#include "pickle_storages.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "spanformer/util/error.h"

namespace spanformer {
namespace {

struct Value {
  enum Kind { other, str, integer, global, tuple } kind = other;
  std::string text;    // str; global: "module name"
  int64_t number = 0;  // integer
  std::shared_ptr<const std::vector<Value>> items;  // tuple
};

// Bytes of one element of torch.<name>Storage (the types LibTorch and torch.save write).
int64_t storage_element_bytes(const std::string& global) {
  static const std::map<std::string, int64_t> sizes = {
      {"torch DoubleStorage", 8}, {"torch FloatStorage", 4},     {"torch HalfStorage", 2},
      {"torch BFloat16Storage", 2}, {"torch LongStorage", 8},    {"torch IntStorage", 4},
      {"torch ShortStorage", 2},  {"torch CharStorage", 1},      {"torch ByteStorage", 1},
      {"torch BoolStorage", 1},   {"torch ComplexFloatStorage", 8}, {"torch ComplexDoubleStorage", 16},
      {"torch UntypedStorage", 1}};
  const auto it = sizes.find(global);
  return it == sizes.end() ? 0 : it->second;
}

class Walk {
 public:
  Walk(const uint8_t* data, size_t size, const std::string& what) : d_(data), n_(size), what_(what) {}

  std::vector<DeclaredStorage> run() {
    while (true) {
      if (at_ >= n_) bad("ends without STOP");
      op_at_ = at_;
      const uint8_t op = d_[at_++];
      switch (op) {
        case '.': return std::move(out_);  // STOP
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(); break;  // POP
        case '1': to_mark(); break;  // POP_MARK
        case '2': push(top()); break;  // DUP
        case 'F': line(); push({}); break;  // FLOAT
        case 'I': push(integer_line()); break;  // INT
        case 'L': push(integer_line()); break;  // LONG
        case 'J': push(number(static_cast<int32_t>(le(4)))); break;  // BININT
        case 'K': push(number(static_cast<int64_t>(le(1)))); break;  // BININT1
        case 'M': push(number(static_cast<int64_t>(le(2)))); break;  // BININT2
        case 0x8a: push(long_bytes(static_cast<size_t>(le(1)))); break;  // LONG1
        case 0x8b: push(long_bytes(length(4))); break;  // LONG4
        case 'G': take(8); push({}); break;  // BINFLOAT
        case 'N': case 0x88: case 0x89: push({}); break;  // NONE, NEWTRUE, NEWFALSE
        case 'S': case 'V': push(string(line())); break;  // STRING, UNICODE
        case 'T': case 'X': push(string(bytes(length(4)))); break;  // BINSTRING, BINUNICODE
        case 'U': case 0x8c: push(string(bytes(length(1)))); break;  // SHORT_BINSTRING, SHORT_BINUNICODE
        case 0x8d: push(string(bytes(length(8)))); break;  // BINUNICODE8
        case 'B': bytes(length(4)); push({}); break;  // BINBYTES
        case 'C': bytes(length(1)); push({}); break;  // SHORT_BINBYTES
        case 0x8e: case 0x96: bytes(length(8)); push({}); break;  // BINBYTES8, BYTEARRAY8
        case ')': case ']': case '}': case 0x8f: push({}); break;  // EMPTY_TUPLE/LIST/DICT/SET
        case 't': push(tuple(to_mark())); break;  // TUPLE
        case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
          std::vector<Value> items(op - 0x84);
          for (size_t i = items.size(); i-- > 0;) items[i] = pop();
          push(tuple(std::move(items)));
          break;
        }
        case 'l': case 'd': case 0x91: to_mark(); push({}); break;  // LIST, DICT, FROZENSET
        case 'a': pop(); top(); break;  // APPEND
        case 'e': case 'u': case 0x90: to_mark(); top(); break;  // APPENDS, SETITEMS, ADDITEMS
        case 's': pop(); pop(); top(); break;  // SETITEM
        case 'b': pop(); top(); break;  // BUILD
        case 'R': case 0x81: pop(); pop(); push({}); break;  // REDUCE, NEWOBJ
        case 0x92: pop(); pop(); pop(); push({}); break;  // NEWOBJ_EX
        case 'o': to_mark(); push({}); break;  // OBJ
        case 'i': line(); line(); to_mark(); push({}); break;  // INST
        case 'c': {  // GLOBAL
          std::string module = line();
          push(global(module + " " + line()));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const Value name = pop(), module = pop();
          push(global(module.text + " " + name.text));
          break;
        }
        case 'P': line(); push({}); break;  // PERSID (text ids: not a storage LibTorch writes)
        case 'Q': push(persistent(pop())); break;  // BINPERSID
        case 'g': push(memo_get(integer_of(line()))); break;  // GET
        case 'h': push(memo_get(le(1))); break;  // BINGET
        case 'j': push(memo_get(le(4))); break;  // LONG_BINGET
        case 'p': memo_[integer_of(line())] = top(); break;  // PUT
        case 'q': memo_[le(1)] = top(); break;  // BINPUT
        case 'r': memo_[le(4)] = top(); break;  // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE (next index: entries are dense)
        case 0x80: take(1); break;  // PROTO
        case 0x95: take(8); break;  // FRAME
        case 0x82: take(1); push({}); break;  // EXT1
        case 0x83: take(2); push({}); break;  // EXT2
        case 0x84: take(4); push({}); break;  // EXT4
        case 0x97: push({}); break;  // NEXT_BUFFER
        case 0x98: top(); break;  // READONLY_BUFFER
        default: bad(fmt::format("unknown opcode 0x{:02x}", op));
      }
    }
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail("{} at byte {}: {}", what_, op_at_, why);
  }

  const uint8_t* take(size_t k) {
    if (k > n_ - at_) bad("an argument runs past the end");
    const uint8_t* p = d_ + at_;
    at_ += k;
    return p;
  }
  uint64_t le(size_t k) {
    const uint8_t* p = take(k);
    uint64_t v = 0;
    for (size_t i = k; i-- > 0;) v = v << 8 | p[i];
    return v;
  }
  size_t length(size_t k) {
    const uint64_t v = le(k);
    if (v > n_ - at_) bad("a length runs past the end");
    return static_cast<size_t>(v);
  }
  std::string bytes(size_t k) {
    const uint8_t* p = take(k);
    return std::string(reinterpret_cast<const char*>(p), k);
  }
  std::string line() {
    const void* end = std::memchr(d_ + at_, '\n', n_ - at_);
    if (end == nullptr) bad("a text argument without its newline");
    const size_t k = static_cast<const uint8_t*>(end) - (d_ + at_);
    std::string s = bytes(k);
    ++at_;
    return s;
  }
  uint64_t integer_of(const std::string& s) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') bad("a memo index that is not a number");
    return v;
  }
  Value integer_line() {
    const std::string s = line();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || errno != 0 || (*end != '\0' && *end != 'L')) return {};  // a float-like or huge value
    return number(v);
  }
  Value long_bytes(size_t k) {  // two's complement, little-endian
    const uint8_t* p = take(k);
    if (k == 0 || k > 8) return k == 0 ? number(0) : Value{};
    uint64_t v = 0;
    for (size_t i = k; i-- > 0;) v = v << 8 | p[i];
    if (k < 8 && (p[k - 1] & 0x80)) v |= ~uint64_t{0} << (8 * k);
    return number(static_cast<int64_t>(v));
  }

  static Value number(int64_t v) { return {Value::integer, {}, v, nullptr}; }
  static Value string(std::string s) { return {Value::str, std::move(s), 0, nullptr}; }
  static Value global(std::string s) { return {Value::global, std::move(s), 0, nullptr}; }
  static Value tuple(std::vector<Value> items) {
    return {Value::tuple, {}, 0, std::make_shared<const std::vector<Value>>(std::move(items))};
  }

  void push(Value v) { stack_.push_back(std::move(v)); }
  const Value& top() {
    if (stack_.size() <= floor()) bad("an opcode needs a value and the stack is empty");
    return stack_.back();
  }
  Value pop() {
    top();
    Value v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<Value> to_mark() {
    if (marks_.empty()) bad("an opcode needs a MARK and there is none");
    std::vector<Value> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back())),
                             std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Value memo_get(uint64_t i) {
    const auto it = memo_.find(i);
    if (it == memo_.end()) bad(fmt::format("memo entry {} was never stored", i));
    return it->second;
  }

  // ('storage', torch.<T>Storage, key, device, numel): one declared storage.
  Value persistent(const Value& id) {
    if (id.kind != Value::tuple || id.items->size() != 5) return {};
    const auto& t = *id.items;
    if (t[0].kind != Value::str || t[0].text != "storage") return {};
    const int64_t element = t[1].kind == Value::global ? storage_element_bytes(t[1].text) : 0;
    if (element == 0) bad(fmt::format("a storage of unknown type '{}'", t[1].text));
    if (t[2].kind != Value::str) bad("a storage without a key");
    if (t[4].kind != Value::integer || t[4].number < 0 || t[4].number > INT64_MAX / element)
      bad(fmt::format("storage '{}' has no valid element count", t[2].text));
    out_.push_back({t[2].text, static_cast<uint64_t>(t[4].number * element)});
    return {};
  }

  const uint8_t* d_;
  size_t n_, at_ = 0, op_at_ = 0;
  const std::string& what_;
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Value> memo_;
  std::vector<DeclaredStorage> out_;
};

}  // namespace

std::vector<DeclaredStorage> pickle_storages(const uint8_t* data, size_t size, const std::string& what) {
  return Walk(data, size, what).run();
}

}  // namespace spanformer
