#pragma once
// ZB-V's compute order (schedule.h): for every rank of pp, its F, B and W actions of two chunks in a
// V, without communication (schedule.cpp places it). Pure and local.
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::pipeline::detail {

std::vector<std::vector<Action>> zeroBubbleVOrders(int pp, int numMicro);

}  // namespace tessera::pipeline::detail
