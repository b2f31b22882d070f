#include "cache/kv_codec.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace lgpt {
namespace {

constexpr double kMaxHalf = 65504.0;

double Levels(int bits) { return bits == 8 ? 127.0 : 7.0; }

class FullCodec : public EntryCodec {
 public:
  FullCodec(int64_t head_size, c10::ScalarType dtype, c10::Device device)
      : head_size_(head_size), dtype_(dtype), device_(device) {}

  std::vector<at::Tensor> Encode(const at::Tensor& keys, const at::Tensor& values) const override {
    return {keys.to(dtype_), values.to(dtype_)};
  }
  void Decode(const std::vector<at::Tensor>& parts, at::Tensor* keys,
              at::Tensor* values) const override {
    if (keys != nullptr) *keys = parts[0];
    if (values != nullptr) *values = parts[1];
  }
  std::vector<at::Tensor> Allocate(int64_t batch, int64_t groups, int64_t capacity) const override {
    const at::TensorOptions opts = at::TensorOptions().dtype(dtype_).device(device_);
    return {at::zeros({batch, groups, capacity, head_size_}, opts),
            at::zeros({batch, groups, capacity, head_size_}, opts)};
  }
  int64_t BytesPerEntry() const override {
    return 2 * head_size_ * static_cast<int64_t>(c10::elementSize(dtype_));
  }
  int key_parts() const override { return 1; }
  int bits() const override { return 16; }
  int64_t head_size() const override { return head_size_; }

 private:
  int64_t head_size_;
  c10::ScalarType dtype_;
  c10::Device device_;
};

class QuantCodec : public EntryCodec {
 public:
  QuantCodec(int bits, int64_t head_size, int64_t group, c10::ScalarType dtype, c10::Device device)
      : bits_(bits), head_size_(head_size), group_(group), dtype_(dtype), device_(device) {}

  // [keys data, keys scales, values data, values scales]
  std::vector<at::Tensor> Encode(const at::Tensor& keys, const at::Tensor& values) const override {
    QuantizedGroups k = QuantizeGroups(keys, bits_, group_);
    QuantizedGroups v = QuantizeGroups(values, bits_, group_);
    return {k.data, k.scales, v.data, v.scales};
  }
  void Decode(const std::vector<at::Tensor>& parts, at::Tensor* keys,
              at::Tensor* values) const override {
    if (keys != nullptr) *keys = DequantizeGroups(parts[0], parts[1], bits_, group_, dtype_);
    if (values != nullptr) *values = DequantizeGroups(parts[2], parts[3], bits_, group_, dtype_);
  }
  std::vector<at::Tensor> Allocate(int64_t batch, int64_t groups, int64_t capacity) const override {
    const at::TensorOptions data_opts =
        at::TensorOptions().dtype(bits_ == 8 ? at::kChar : at::kByte).device(device_);
    const at::TensorOptions scale_opts = at::TensorOptions().dtype(at::kHalf).device(device_);
    const int64_t width = head_size_ * bits_ / 8, n_scales = head_size_ / group_;
    std::vector<at::Tensor> parts;
    for (int i = 0; i < 2; ++i) {
      parts.push_back(at::zeros({batch, groups, capacity, width}, data_opts));
      parts.push_back(at::zeros({batch, groups, capacity, n_scales}, scale_opts));
    }
    return parts;
  }
  int64_t BytesPerEntry() const override {
    return 2 * (head_size_ * bits_ / 8 + 2 * (head_size_ / group_));
  }
  int key_parts() const override { return 2; }
  int bits() const override { return bits_; }
  int64_t head_size() const override { return head_size_; }

 private:
  int bits_;
  int64_t head_size_;
  int64_t group_;
  c10::ScalarType dtype_;
  c10::Device device_;
};

}  // namespace

QuantizedGroups QuantizeGroups(const at::Tensor& x, int bits, int64_t group) {
  const int64_t n = x.size(-1);
  std::vector<int64_t> sizes = x.sizes().vec();
  std::vector<int64_t> grouped = sizes;
  grouped.back() = n / group;
  grouped.push_back(group);
  const double levels = Levels(bits);
  const at::Tensor g = x.to(at::kFloat).reshape(grouped);  // [..., n / group, group]
  // The scale is rounded to float16 before quantising, so decoding sees the very scale the
  // integers were chosen for; it saturates at float16's largest value.
  const at::Tensor scale =
      g.abs().amax(-1, /*keepdim=*/true).div_(levels).clamp_max_(kMaxHalf).to(at::kHalf);
  const at::Tensor scale_f = scale.to(at::kFloat);
  const at::Tensor inverse = at::where(scale_f > 0, scale_f.reciprocal(), at::zeros_like(scale_f));
  at::Tensor q = (g * inverse).round_().clamp_(-levels, levels).reshape(sizes);
  QuantizedGroups out;
  out.scales = scale.squeeze(-1);
  if (bits == 8) {
    out.data = q.to(at::kChar);
  } else {
    std::vector<int64_t> pairs = sizes;
    pairs.back() = n / 2;
    pairs.push_back(2);
    const at::Tensor u = q.add_(8).to(at::kByte).reshape(pairs);  // [..., n / 2, 2] in 1..15
    out.data = u.select(-1, 0) + u.select(-1, 1) * 16;
  }
  return out;
}

at::Tensor DequantizeGroups(const at::Tensor& data, const at::Tensor& scales, int bits,
                            int64_t group, c10::ScalarType dtype) {
  at::Tensor q;
  if (bits == 8) {
    q = data.to(at::kFloat);
  } else {
    const at::Tensor low = at::bitwise_and(data, 15);
    const at::Tensor high = at::bitwise_right_shift(data, 4);
    std::vector<int64_t> sizes = data.sizes().vec();
    sizes.back() *= 2;
    q = at::stack({low, high}, -1).to(at::kFloat).reshape(sizes).sub_(8);
  }
  std::vector<int64_t> sizes = q.sizes().vec();
  std::vector<int64_t> grouped = sizes;
  grouped.back() /= group;
  grouped.push_back(group);
  return q.reshape(grouped).mul_(scales.to(at::kFloat).unsqueeze(-1)).reshape(sizes).to(dtype);
}

std::unique_ptr<EntryCodec> MakeFullCodec(int64_t head_size, c10::ScalarType dtype,
                                          c10::Device device) {
  return std::make_unique<FullCodec>(head_size, dtype, device);
}

absl::StatusOr<std::unique_ptr<EntryCodec>> MakeQuantCodec(int bits, int64_t head_size,
                                                           int64_t group_size,
                                                           c10::ScalarType dtype,
                                                           c10::Device device) {
  if (bits != 8 && bits != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantised KV entries take 8 or 4 bits, got ", bits));
  }
  if (head_size < 1 || (bits == 4 && head_size % 2 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_size ", head_size, " cannot be stored in ", bits, " bits"));
  }
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantisation group size must be >= 1, got ", group_size));
  }
  const int64_t group = std::gcd(group_size, head_size);
  return std::unique_ptr<EntryCodec>(
      std::make_unique<QuantCodec>(bits, head_size, group, dtype, device));
}

void QuantizeRow(const float* x, int64_t n, int bits, int64_t group, void* data, at::Half* scales) {
  const float levels = static_cast<float>(Levels(bits));
  auto* int8 = static_cast<int8_t*>(data);
  auto* nibbles = static_cast<uint8_t*>(data);
  for (int64_t begin = 0; begin < n; begin += group) {
    float absmax = 0.0f;
    for (int64_t i = begin; i < begin + group; ++i) absmax = std::max(absmax, std::abs(x[i]));
    const at::Half scale(std::min(absmax / levels, static_cast<float>(kMaxHalf)));
    scales[begin / group] = scale;
    const float scale_f = static_cast<float>(scale);
    const float inverse = scale_f > 0 ? 1.0f / scale_f : 0.0f;
    for (int64_t i = begin; i < begin + group; ++i) {
      const float q = std::clamp(std::nearbyint(x[i] * inverse), -levels, levels);
      if (bits == 8) {
        int8[i] = static_cast<int8_t>(q);
      } else if (i % 2 == 0) {
        nibbles[i / 2] = static_cast<uint8_t>(q + 8);
      } else {
        nibbles[i / 2] = static_cast<uint8_t>(nibbles[i / 2] + static_cast<uint8_t>(q + 8) * 16);
      }
    }
  }
}

void DequantizeRow(const void* data, const at::Half* scales, int64_t n, int bits, int64_t group,
                   float* out) {
  const auto* int8 = static_cast<const int8_t*>(data);
  const auto* nibbles = static_cast<const uint8_t*>(data);
  for (int64_t begin = 0; begin < n; begin += group) {
    const float scale = static_cast<float>(scales[begin / group]);
    for (int64_t i = begin; i < begin + group; ++i) {
      const int q = bits == 8 ? int8[i] : ((nibbles[i / 2] >> (4 * (i % 2))) & 15) - 8;
      out[i] = static_cast<float>(q) * scale;
    }
  }
}

}  // namespace lgpt
