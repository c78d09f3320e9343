#include <gtest/gtest.h>
#include "model/io/pil_resize.h"
TEST(PilResize, Identity) { maskd::ImageRGB8 im{2,1,{1,2,3,4,5,6}}; auto o = maskd::PilResizeBilinear(im,2,1); EXPECT_EQ(o.pixels, im.pixels); }
