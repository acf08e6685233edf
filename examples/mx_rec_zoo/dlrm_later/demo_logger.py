# coding=utf-8
# Copyright 2024. Huawei Technologies Co.,Ltd. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# mxrec port of a later RecSDK examples/dlrm/model/demo_logger.py (SimmerChan/RecSDK): the
# original has no licence header (this one is the example's). Every change is marked
# "mxrec port:".
import logging
import os


def get_logger(log_level: str):
    dlrm_logger = logging.getLogger("dlrm")
    formatter = logging.Formatter(fmt="[%(asctime)s] [%(levelname)s] %(message)s",
                                  datefmt="%m/%d/%Y %H:%M:%S %p")
    stream_handler = logging.StreamHandler()
    stream_handler.setFormatter(formatter)
    dlrm_logger.addHandler(stream_handler)
    dlrm_logger.setLevel(log_level)
    return dlrm_logger


# mxrec port: the level from MXREC_LOG_LEVEL when set (the tests run quietly); was "Debug",
# which logging rejects on Python 3.11 (levels are upper case)
logger = get_logger(os.getenv("MXREC_LOG_LEVEL", "DEBUG").upper())
