#include "model/tensor_file.h"

#include "model/checkpoint.h"

namespace maskd {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

namespace {

at::ScalarType ScalarTypeOf(const std::string& dtype) {
  static const std::pair<const char*, at::ScalarType> kTypes[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"int64", at::kLong}, {"int32", at::kInt},
      {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte}, {"bool", at::kBool}};
  for (auto& [n, t] : kTypes)
    if (dtype == n) return t;
  throw std::invalid_argument("unknown dtype " + dtype);
}

std::string DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

at::Tensor AsTensor(const HostTensor& h) {
  return at::from_blob(const_cast<uint8_t*>(h.data.data()), h.shape,
                       at::TensorOptions().dtype(ScalarTypeOf(h.dtype)));
}

}  // namespace

std::vector<float> HostTensor::ToFloat() const {
  at::Tensor t = AsTensor(*this).to(at::kFloat).contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

std::vector<int64_t> HostTensor::ToInt64() const {
  at::Tensor t = AsTensor(*this).to(at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

StatusOr<TensorMap> ReadTensorFile(const std::string& path) {
  auto sd = ReadStateDict(path);
  if (!sd.ok()) return sd.status();
  TensorMap out;
  for (auto& [name, t] : *sd) {
    HostTensor h;
    h.dtype = DtypeName(t.scalar_type());
    h.shape = t.sizes().vec();
    at::Tensor c = t.contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    h.data.assign(p, p + c.nbytes());
    out.emplace_back(name, std::move(h));
  }
  return out;
}

const HostTensor* FindTensor(const TensorMap& tensors, const std::string& name) {
  for (auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

}  // namespace maskd
