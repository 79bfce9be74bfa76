// spanformer spans: per-layer, per-head learned spans of any family's checkpoint, printed and drawn.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/viz/span_plot.h"

namespace spanformer::cli {

void print_spans(const std::vector<std::vector<double>>& spans) {
  for (size_t l = 0; l < spans.size(); ++l) {
    double sum = 0;
    for (double z : spans[l]) sum += z;
    fmt::print("layer {:>2}: mean {:7.1f} | heads {:.1f}\n", l, sum / static_cast<double>(spans[l].size()),
               fmt::join(spans[l], " "));
  }
}

void add_spans(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string checkpoint, out = "spans.png", layout = "auto";
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("spans", "print per-layer, per-head spans and draw them");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--out,-o", o->out, "picture to write (.png, .svg or .pdf; the numbers go to .json beside it)")
      ->capture_default_str();
  cmd->add_option("--layout", o->layout,
                  "curves (mask per head + bars) | grid (layers x heads heat map) | auto (grid beyond 32 heads)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "curves", "grid"}));
  cmd->add_flag("--json", o->json, "print one JSON record (spans per layer and head, in tokens) instead of the text");
  cmd->callback([o, &run] {
    run = [o] {
      const auto layout = viz::parse_span_layout(o->layout);
      train::Checkpoint ck(o->checkpoint);
      auto family = train::family_from_checkpoint(ck);
      const auto& learned = family->need<train::Spans>();
      const auto spans = learned.spans();
      if (spans.empty()) fail("{}: this {} model learns no spans (adapt_span is off)", o->checkpoint, family->name());
      if (!o->json) print_spans(spans);
      viz::SpanPlotOptions options;
      options.layout = layout;
      options.attn_span = learned.span_limit();
      options.ramp = learned.span_ramp();
      options.title = fmt::format("Learned spans: {}", o->checkpoint);
      viz::write_span_plot(o->out, spans, options);
      if (o->json)
        fmt::print("{}\n", nlohmann::json{{"checkpoint", ck.path()}, {"family", family->name()}, {"spans", spans},
                                          {"span_limit", learned.span_limit()}, {"ramp", learned.span_ramp()},
                                          {"picture", o->out}}.dump());
      else
        fmt::print("span picture: {}\n", o->out);
    };
  });
}

}  // namespace spanformer::cli
