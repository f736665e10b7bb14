from django.urls import path

from checkout import views

urlpatterns = [
    path("<str:session_id>", views.page, name="checkout-page"),
    path("<str:session_id>/pay", views.pay, name="checkout-pay"),
]
