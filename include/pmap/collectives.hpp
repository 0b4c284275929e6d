#pragma once
#include "pmap/context.hpp"
