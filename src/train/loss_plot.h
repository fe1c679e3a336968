// Internal: the loss curve a training run leaves in its output directory, as a self-contained SVG
// (no plotting library: a polyline over labelled axes). Deliberately nothing interactive.
#pragma once

#include <string>
#include <vector>

#include "hk/train_checkpoint.h"

namespace hk::train_detail {

// SVG text of loss against step for the logged steps (at least one needed; NaN skipped).
std::string loss_curve_svg(const std::vector<TrainerLogEntry>& history, const std::string& title);

}  // namespace hk::train_detail
