#include <gtest/gtest.h>

#include <ATen/Parallel.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  at::set_num_threads(2);
  return RUN_ALL_TESTS();
}
