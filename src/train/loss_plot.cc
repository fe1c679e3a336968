// The loss-curve SVG (train/loss_plot.h).
#include "train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace hk::train_detail {
namespace {

std::string fmt(double v, const char* f = "%.4g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string loss_curve_svg(const std::vector<TrainerLogEntry>& history, const std::string& title) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& e : history)
    if (std::isfinite(e.loss)) pts.emplace_back(static_cast<double>(e.step), e.loss);
  const double width = 640, height = 400, left = 64, right = 16, top = 40, bottom = 48;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!pts.empty()) {
    x0 = pts.front().first;
    x1 = pts.back().first;
    auto [lo, hi] = std::minmax_element(pts.begin(), pts.end(),
                                        [](auto& a, auto& b) { return a.second < b.second; });
    y0 = lo->second;
    y1 = hi->second;
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  const double pad = 0.05 * (y1 - y0);
  y0 = y0 >= 0 ? std::max(0.0, y0 - pad) : y0 - pad;  // a loss axis does not go below 0
  y1 += pad;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (width - left - right); };
  auto py = [&](double y) { return top + (y1 - y) / (y1 - y0) * (height - top - bottom); };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" "
    << "font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">"
    << escape_xml(title) << "</text>\n";
  // Axes, ticks and grid.
  s << "<g stroke=\"#ccc\">\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4.0;
    s << "<line x1=\"" << left << "\" x2=\"" << width - right << "\" y1=\"" << py(y) << "\" y2=\""
      << py(y) << "\"/>\n";
  }
  s << "</g>\n<g>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4.0;
    s << "<text x=\"" << left - 6 << "\" y=\"" << py(y) + 4 << "\" text-anchor=\"end\">" << fmt(y)
      << "</text>\n";
    const double x = x0 + (x1 - x0) * i / 4.0;
    s << "<text x=\"" << px(x) << "\" y=\"" << height - bottom + 18 << "\" text-anchor=\"middle\">"
      << fmt(std::round(x), "%.0f") << "</text>\n";
  }
  s << "<text x=\"" << (left + width - right) / 2 << "\" y=\"" << height - 10
    << "\" text-anchor=\"middle\">step</text>\n";
  s << "<text x=\"16\" y=\"" << (top + height - bottom) / 2 << "\" text-anchor=\"middle\" "
    << "transform=\"rotate(-90 16 " << (top + height - bottom) / 2 << ")\">loss</text>\n";
  s << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << width - left - right
    << "\" height=\"" << height - top - bottom << "\" fill=\"none\" stroke=\"#333\"/>\n</g>\n";
  if (!pts.empty()) {
    s << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"";
    for (const auto& [x, y] : pts) s << fmt(px(x), "%.1f") << "," << fmt(py(y), "%.1f") << " ";
    s << "\"/>\n";
    if (pts.size() <= 60)
      for (const auto& [x, y] : pts)
        s << "<circle cx=\"" << fmt(px(x), "%.1f") << "\" cy=\"" << fmt(py(y), "%.1f")
          << "\" r=\"2.5\" fill=\"#d62728\"/>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace hk::train_detail
