#include "spanformer/metrics/units.h"

#include <cmath>

#include "spanformer/util/names.h"

namespace spanformer::metrics {

namespace {
constexpr auto kUnitNames = name_table("unit", std::pair{Unit::kBpc, "bpc"}, std::pair{Unit::kPpl, "ppl"},
                                       std::pair{Unit::kNats, "nats"});
}  // namespace

const char* unit_name(Unit unit) { return kUnitNames.name(unit); }
Unit parse_unit(const std::string& name) { return kUnitNames.parse(name); }

double in_unit(double nll, Unit unit) {
  return unit == Unit::kPpl ? std::exp(nll) : unit == Unit::kBpc ? nll / std::log(2.0) : nll;
}

}  // namespace spanformer::metrics
