"""theorems"""
