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
# mxrec port of RecSDK examples/dlrm/model (Ascend/RecSDK); every change is marked
# "mxrec port:". Every `mxrec` import was `mx_rec` (the renaming mxrec asks for).
# (this file: the SimmerChan/RecSDK mirror, commit 21bc81de)

import time  # noqa: F401  (unused, as in the original)
# mxrec port: removed `from easydict import EasyDict as edict` (model_cfg is unused)

import tensorflow.compat.v1 as tf  # mxrec port: TF's migration recipe

from zoo_port import binary_crossentropy_from_logits, dense  # mxrec port: tf.layers / keras loss

LOSS_OP_NAME = "loss"
LABEL_OP_NAME = "label"
VAR_LIST = "variable"
PRED_OP_NAME = "pred"


def _init(seed):
    return tf.variance_scaling_initializer(mode="fan_avg", distribution='normal', seed=seed)


class MyModel:
    def __init__(self):
        self.kernel_init = None
        self._loss_fn = None
        self.is_training = None

    @classmethod
    def _dot_interaction(cls, _input):
        num_features = tf.shape(_input)[1]
        batch_size = tf.shape(_input)[0]
        xactions = tf.matmul(_input, _input, transpose_b=True)
        ones = tf.ones_like(xactions, dtype=tf.float32)
        upper_tri_mask = tf.linalg.band_part(ones, 0, -1)

        activations = tf.where(condition=tf.cast(upper_tri_mask, tf.bool),
                                x=tf.zeros_like(xactions),
                                y=xactions)
        out_dim = num_features * num_features
        activations = tf.reshape(activations, (batch_size, out_dim))
        return activations

    def build_model(self,
                    embedding=None,
                    dense_feature=None,
                    label=None,
                    is_training=True,
                    seed=None):
        with tf.variable_scope("mlp", reuse=tf.AUTO_REUSE):
            self._loss_fn = binary_crossentropy_from_logits  # mxrec port: was tf.keras.losses.BinaryCrossentropy(from_logits=True)
            self.is_training = is_training
            dense_embedding_vec = self.bottom_stack(dense_feature, seed)
            dense_embedding = tf.expand_dims(dense_embedding_vec, 1)
            interaction_args = tf.concat([dense_embedding, embedding], axis=1)
            interaction_output = self._dot_interaction(interaction_args)
            # mxrec port: the static width of the interaction (TF 1.15 inferred it from the
            # NPU's static shapes); 27 = the dense vector and the 26 fields
            interaction_output.set_shape([None, 27 * 27])
            feature_interaction_output = tf.concat([dense_embedding_vec, interaction_output], axis=1)
            # (8192, 857)
            logits = self.top_stack(feature_interaction_output, seed)
            loss = self._loss_fn(label, logits)
            prediction = tf.sigmoid(logits)
            trainable_variables = tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES, scope='mlp')
            return {LOSS_OP_NAME: loss,
                    PRED_OP_NAME: prediction,
                    LABEL_OP_NAME: label,
                    VAR_LIST: trainable_variables}

    # mxrec port: tf.layers.dense -> zoo_port.dense, same units, activations and
    # initializers; kernel_regularizer=tf.contrib.layers.l1_regularizer(1e-2) dropped
    # (tf.contrib is gone; the example never adds the regularization losses to its loss)
    def bottom_stack(self, _input, seed):
        dnn1 = dense(_input, 512, activation='relu', name='bs1', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        dnn2 = dense(dnn1, 256, activation='relu', name='bs2', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        dnn3 = dense(dnn2, 128, activation='relu', name='bs3', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        return dnn3

    def top_stack(self, _input, seed):
        dnn1 = dense(_input, 1024, activation='relu', name='ts1', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        dnn2 = dense(dnn1, 1024, activation='relu', name='ts2', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        dnn3 = dense(dnn2, 512, activation='relu', name='ts3', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        dnn4 = dense(dnn3, 256, activation='relu', name='ts4', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        dnn5 = dense(dnn4, 1, activation=None, name='ts5', kernel_initializer=_init(seed), bias_initializer=_init(seed))
        return dnn5


my_model = MyModel()
