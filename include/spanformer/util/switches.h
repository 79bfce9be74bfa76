// The environment switches that choose an implementation, in one table: each variable, the values it
// takes (the first is what an unset or empty variable means) and what it chooses. Every reader asks
// `switch_value`, so that a value outside the table is one line of one form,
//     SPANFORMER_STEP_KERNELS=fast is not one of: auto, kernels, composition
// and `spanformer --version` prints every switch with its value (`switches_text`). The rows forced by
// the ops' backend overrides (FlashBackendOverride, the span op's row argument) are arguments of the
// tests and benchmarks, not switches.
#pragma once
#include <string>
#include <vector>

namespace spanformer {

struct Switch {
  const char* variable;
  std::vector<std::string> values;  // values[0]: the default
  const char* what;
};

// Every switch, in the order --version prints them.
const std::vector<Switch>& switches();
// The value of `variable` (a row of switches()): the variable's own when set and non-empty, else the
// row's default; a value the row does not list is a one-line error naming them.
std::string switch_value(const char* variable);
// "SPANFORMER_CPU_HALF_PRODUCTS=auto, SPANFORMER_STEP_KERNELS=auto, ...": each switch and its value
// (a bad value shows as given, followed by "(not one of its values)").
std::string switches_text();

}  // namespace spanformer
