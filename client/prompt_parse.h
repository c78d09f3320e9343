// Text forms of prompts and formats used on maskctl's command line (and by anything else that
// takes prompts as text). Errors name the text, the field and what was expected.
#pragma once

#include <string>
#include <string_view>

#include "client/client.h"

namespace maskd::client {

// "x,y" (foreground) or "x,y,label" with label 1|fg|foreground|0|bg|background.
StatusOr<PointArg> ParsePoint(std::string_view text);
// "x0,y0,x1,y1".
StatusOr<BoxArg> ParseBox(std::string_view text);
// rle|coco_rle, png, logits|low_res_logits.
StatusOr<v1::OutputFormat> ParseOutputFormat(std::string_view text);
const char* OutputFormatName(v1::OutputFormat format);

}  // namespace maskd::client
