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
# mxrec port of RecSDK examples/WideDeep/model (Ascend/RecSDK); every change is marked
# "mxrec port:". Every `mxrec` import was `mx_rec` (the renaming mxrec asks for).
# (this file: RecSDK examples/WideDeep/model/model.py, Ascend/RecSDK commit 84c5b10b)

import time  # noqa: F401  (unused, as in the original)
# mxrec port: removed `from easydict import EasyDict as edict` (model_cfg is unused)

import tensorflow.compat.v1 as tf  # mxrec port: TF's migration recipe

from zoo_port import binary_crossentropy_from_logits, dense  # mxrec port: tf.layers / keras loss

LOSS_OP_NAME = "loss"
LABEL_OP_NAME = "label"
VAR_LIST = "variable"
PRED_OP_NAME = "pred"


class MyModel:
    def __init__(self):
        self.kernel_init = None
        self._loss_fn = None
        self.is_training = None

    def build_model(self,model_args):
        wide_embedding = model_args.wide_embedding
        deep_embedding = model_args.deep_embedding
        label = model_args.label
        is_training = model_args.is_training
        seed = model_args.seed
        dropout_rate = model_args.dropout_rate
        batch_norm = model_args.batch_norm

        with tf.variable_scope("wide_deep", reuse=tf.AUTO_REUSE):
            self._loss_fn = binary_crossentropy_from_logits  # mxrec port: was tf.keras.losses.BinaryCrossentropy(from_logits=True)
            self.is_training = is_training

            # wide
            batch_size, wide_num, wide_emb_dim = wide_embedding.shape
            wide_input = tf.reshape(wide_embedding[:, :, 0], shape=(batch_size, wide_num * 1))
            wide_output = tf.reshape(tf.reduce_sum(wide_input, axis=1), shape=(-1, 1))

            # deep
            batch_size, deep_num, deep_emb_dim = deep_embedding.shape
            deep_input = tf.reshape(deep_embedding, shape=(batch_size, deep_num * deep_emb_dim))

            ## MLP
            hidden_units = [256, 128, 64]
            net = deep_input
            for i, unit in enumerate(hidden_units):

                # mxrec port: tf.layers.dense -> zoo_port.dense (same units, initializers)
                net = dense(net, units=unit, activation='relu', name=f'hidden_layer_{i}',
                            kernel_initializer=tf.glorot_uniform_initializer(seed=seed),
                            bias_initializer=tf.zeros_initializer())

                if dropout_rate is not None and 0.0 < dropout_rate < 1.0:
                    # mxrec port: tf.layers.dropout(net, rate, training=...) -> tf.nn.dropout
                    # when training (is_training is a Python bool here)
                    if self.is_training:
                        net = tf.nn.dropout(net, rate=dropout_rate, seed=seed)
                if batch_norm:
                    # mxrec port: tf.layers.batch_normalization is gone with tf_keras in TF
                    # 2.16+; the example passes batch_norm=False
                    raise NotImplementedError("mxrec port: batch_norm=True is not ported")

            deep_output = dense(net, units=1, activation=None, name='deep_output',  # mxrec port: tf.layers.dense
                                kernel_initializer=tf.glorot_uniform_initializer(seed=seed),
                                bias_initializer=tf.zeros_initializer())

            total_logits = 0.5 * tf.add(wide_output, deep_output, name='total_logits')
            loss = self._loss_fn(label, total_logits)
            prediction = tf.sigmoid(total_logits)
            trainable_variables = tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES, scope='wide_deep')
            return {LOSS_OP_NAME: loss,
                    PRED_OP_NAME: prediction,
                    LABEL_OP_NAME: label,
                    VAR_LIST: trainable_variables}


my_model = MyModel()
