// Linked into a program that carries the lab (lab.h): its rows added before main.
#include "lab.h"

namespace {
const bool lab_registered = (spanformer::lab::register_rows(), true);
}  // namespace
