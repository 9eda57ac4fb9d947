// NonMaxSuppression (ONNX operator doc, ai.onnx opsets 10 and 11, the same semantics).
//
// NonMaxSuppression(boxes [B, N, 4] float32, scores [B, C, N] float32,
//                   max_output_boxes_per_class? int64 scalar (default 0: no output),
//                   iou_threshold? float32 scalar in [0, 1] (default 0),
//                   score_threshold? float32 scalar; center_point_box = 0 or 1)
//   -> selected_indices [count, 3] int64 of (batch, class, box).
// For each batch and class, in that order: the boxes whose score is not less than
// score_threshold (the op doc: "boxes with score less than score_threshold are removed"; ONNX
// Runtime and the ONNX reference implementation also drop a score equal to it) are visited by
// decreasing score, ties by lower index; a box is selected unless its IoU with a box already
// selected in this class is strictly greater than iou_threshold, until
// max_output_boxes_per_class are selected (a negative maximum selects none). A NaN score is
// never selected.
// Boxes are [y1, x1, y2, x2] with the corners in either order (center_point_box=0) or
// [x_center, y_center, width, height] (1). The IoU of boxes without area, or without
// overlap, is 0. The thresholds and maximum are 0-D or 1-D of one element.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// A box as (y_min, x_min, y_max, x_max).
using Box = std::array<float, 4>;

Box corners(const float* b, bool center) {
  if (center) {
    const float hw = b[2] / 2, hh = b[3] / 2;
    return {b[1] - hh, b[0] - hw, b[1] + hh, b[0] + hw};
  }
  return {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
}

float iou(const Box& a, const Box& b) {
  const float h = std::min(a[2], b[2]) - std::max(a[0], b[0]);
  const float w = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (!(h > 0 && w > 0)) return 0;
  const float inter = h * w;
  const float area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
  const float uni = area_a + area_b - inter;
  return uni > 0 ? inter / uni : 0;
}

class NonMaxSuppression final : public Kernel {
 public:
  explicit NonMaxSuppression(const KernelInit& init) {
    const int64_t c = init.attr_int("center_point_box", 0);
    if (c != 0 && c != 1) throw Error("NonMaxSuppression attribute 'center_point_box' must be 0 or 1, got " + std::to_string(c));
    center_ = c == 1;
  }

  void run(KernelContext& ctx) override {
    const Tensor& boxes = ctx.input(0);
    const Tensor& scores = ctx.input(1);
    if (boxes.dtype() != DataType::Float32 || boxes.rank() != 3 || boxes.dim(2) != 4) {
      throw Error("input " + ctx.input_name(0) + " (boxes) must be float32 [batches, boxes, 4], got " + boxes.description());
    }
    if (scores.dtype() != DataType::Float32 || scores.rank() != 3 || scores.dim(0) != boxes.dim(0) ||
        scores.dim(2) != boxes.dim(1)) {
      throw Error("input " + ctx.input_name(1) + " (scores) must be float32 [" + std::to_string(boxes.dim(0)) +
                  ", classes, " + std::to_string(boxes.dim(1)) + "] to match the boxes, got " + scores.description());
    }
    const int64_t max_boxes = ctx.has_input(2) ? scalar_of<int64_t>(ctx, 2, DataType::Int64, "max_output_boxes_per_class") : 0;
    const float iou_max = ctx.has_input(3) ? scalar_of<float>(ctx, 3, DataType::Float32, "iou_threshold") : 0.0f;
    if (!(iou_max >= 0 && iou_max <= 1)) {
      throw Error("input " + ctx.input_name(3) + " (iou_threshold) must be in [0, 1], got " + std::to_string(iou_max));
    }
    const bool filter = ctx.has_input(4);
    const float score_min = filter ? scalar_of<float>(ctx, 4, DataType::Float32, "score_threshold") : 0.0f;
    const int64_t batches = boxes.dim(0), n = boxes.dim(1), classes = scores.dim(1);
    std::vector<int64_t> selected;  // (batch, class, box) triples
    std::vector<int64_t> order, kept;
    std::vector<Box> box(static_cast<size_t>(n));
    for (int64_t b = 0; b < batches && max_boxes > 0; ++b) {
      for (int64_t i = 0; i < n; ++i) box[static_cast<size_t>(i)] = corners(boxes.data<float>() + (b * n + i) * 4, center_);
      for (int64_t c = 0; c < classes; ++c) {
        const float* s = scores.data<float>() + (b * classes + c) * n;
        order.clear();
        for (int64_t i = 0; i < n; ++i) {
          if (!std::isnan(s[i]) && (!filter || s[i] >= score_min)) order.push_back(i);
        }
        std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return s[p] > s[q]; });
        kept.clear();
        for (int64_t i : order) {
          if (static_cast<int64_t>(kept.size()) >= max_boxes) break;
          const bool suppressed = std::any_of(kept.begin(), kept.end(), [&](int64_t k) {
            return iou(box[static_cast<size_t>(i)], box[static_cast<size_t>(k)]) > iou_max;
          });
          if (suppressed) continue;
          kept.push_back(i);
          selected.insert(selected.end(), {b, c, i});
        }
      }
    }
    Tensor& y = ctx.allocate_output(0, DataType::Int64, Shape{static_cast<int64_t>(selected.size() / 3), 3});
    std::copy(selected.begin(), selected.end(), y.data<int64_t>());
  }

 private:
  template <class T>
  static T scalar_of(const KernelContext& ctx, int i, DataType dtype, const std::string& role) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != dtype || t.rank() > 1 || t.numel() != 1) {
      throw Error("input " + ctx.input_name(i) + " (" + role + ") must be a " + std::string(dtype_name(dtype)) +
                  " scalar, got " + t.description());
    }
    return t.data<T>()[0];
  }

  bool center_ = false;
};

}  // namespace

std::unique_ptr<Kernel> make_non_max_suppression(const KernelInit& init) {
  return std::make_unique<NonMaxSuppression>(init);
}

}  // namespace onnxtrain::ops
